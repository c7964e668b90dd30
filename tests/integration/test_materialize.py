"""Server-side materialization: a real daemon runs entry points in spawned workers; happy
paths, bad input, the CLI and block sizes (crashes, SIGTERM, full disks and --max-bytes:
test_materialize_recovery.py)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from daemon import Daemon, env_without_tf_noise
from waits import wait_until

tf = pytest.importorskip("tensorflow")

from materializing import (  # noqa: E402
    ALLOW,
    assert_records,
    materializing_daemon,
    workers_of,
)

from client import (  # noqa: E402
    CacheClient,
    CacheExistsError,
    CacheNotFoundError,
    CacheNotReadyError,
    InvalidArgumentError,
    OperationCancelledError,
    PipelineError,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = materializing_daemon(tmp_path_factory.mktemp("gate") / "never-opened")
    yield d
    d.close()


@pytest.fixture
def mc(mdaemon: Daemon) -> Iterator[CacheClient]:
    with CacheClient(mdaemon.unix_target) as client:
        yield client


# --------------------------------------------------------------------------- happy paths


def test_an_entry_point_is_materialized_in_shard_order_and_reads_back_element_for_element(
    mc: CacheClient, mdaemon: Daemon, name: str
) -> None:
    info = mc.materialize("mat_pipelines:records", name=name, num_shards=3, workers=2)
    assert (info.state, info.num_shards, info.num_elements) == ("READY", 3, 20 + 21 + 22)
    assert_records(mc.dataset(name), 3)
    assert "libtensorflow" not in Path(f"/proc/{mdaemon.proc.pid}/maps").read_text(), (
        "the daemon itself must not load TensorFlow; only its workers do"
    )


def test_a_dataset_built_from_tf_ops_is_shipped_as_a_graph_and_sharded_by_the_daemon(
    mc: CacheClient, name: str
) -> None:
    ds = tf.data.Dataset.range(50).map(lambda x: (x * x, tf.strings.as_string(x)))
    info = mc.materialize(ds, name=name, num_shards=4, workers=2)
    want = [e for i in range(4) for e in ds.shard(4, i).as_numpy_iterator()]
    assert info.num_elements == 50
    assert list(mc.dataset(name).as_numpy_iterator()) == want


def test_a_pipeline_running_python_code_is_refused_with_the_ways_that_work(
    mc: CacheClient, name: str
) -> None:
    ds = tf.data.Dataset.range(5).map(lambda x: tf.py_function(lambda y: y, [x], tf.int64))
    with pytest.raises(
        InvalidArgumentError,
        match=r"(?s)cannot be shipped.*entry point.*"
        r"cc\.cache\(ds",
    ):
        mc.materialize(ds, name=name, num_shards=2)
    with pytest.raises(CacheNotFoundError):
        mc.info(name)


def test_progress_is_watched_a_ready_cache_keeps_serving_and_cancel_stops_the_workers(
    mc: CacheClient, mdaemon: Daemon, name: str
) -> None:
    ready = f"{name}-ready"
    mc.materialize("mat_pipelines:records", name=ready, num_shards=1, workers=1)
    op = mc.materialize("mat_pipelines:gated", name=name, num_shards=4, workers=2, wait=False)
    wait_until(lambda: op.progress().shards_done == 2, 120, "shards 0 and 1 committed")
    progress = op.progress()
    assert (progress.state, progress.done, progress.shards_total) == ("RUNNING", False, 4)
    assert progress.elements >= 41 and progress.stored_bytes > 0 and progress.workers == 2
    assert "2/4 shards" in progress.line()
    assert {c.name: c.state for c in mc.list()}[name] == "WRITING"
    with pytest.raises(CacheNotReadyError, match="WRITING"):
        mc.dataset(name)
    assert_records(mc.dataset(ready), 1)
    workers = workers_of(mdaemon.proc.pid)
    assert len(workers) >= 2
    cancelled = op.cancel()
    assert cancelled.state == "CANCELLED"
    with pytest.raises(OperationCancelledError, match="cancelled"):
        op.wait(timeout=120)
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive, "cancelled workers must exit"
    with pytest.raises(CacheNotFoundError):
        mc.info(name)
    assert not (mdaemon.data_dir / "caches" / name).exists()


# --------------------------------------------------------------------------- bad input

#: Broken pipelines whose shards differ: one fails, or disagrees, while another runs.
SHARD_FAILURES = (
    "mat_pipelines:mixed_specs",
    "mat_pipelines:raises",
    "mat_pipelines:fails_while_reading",
)


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        (
            "no_such_module:fn",
            InvalidArgumentError,
            r"cannot import entry point 'no_such_module:fn'.*--pythonpath",
        ),
        ("mat_pipelines:missing", InvalidArgumentError, r"has no attribute 'missing'"),
        ("mat_pipelines:NOT_CALLABLE", InvalidArgumentError, r"is a int, not a function"),
        (
            "mat_pipelines:not_a_dataset",
            InvalidArgumentError,
            r"returned builtins.list for shard \d; it must return a tf.data.Dataset",
        ),
        (
            "mat_pipelines:mixed_specs",
            InvalidArgumentError,
            r"shard \d yields elements of another spec than shard \d.*float32",
        ),
        ("mat_pipelines:infinite", InvalidArgumentError, r"infinite; drop the .repeat\(\)"),
        (
            "mat_pipelines:raises",
            PipelineError,
            r"shard 1: the pipeline raised FileNotFoundError: source file "
            r"/data/part-00001.tfrecord is missing",
        ),
        ("mat_pipelines:fails_while_reading", PipelineError, r"shard 1: .*label out of range"),
    ],
)
def test_a_bad_pipeline_fails_the_operation_with_a_clear_message_and_leaves_no_cache(
    mc: CacheClient, name: str, entry: str, error: type, message: str
) -> None:
    # a pipeline broken alike in every shard fails in the first worker; a second worker
    # (another TensorFlow import) only matters where one shard fails while another runs
    workers = 2 if entry in SHARD_FAILURES else 1
    with pytest.raises(error, match=f"(?s){message}"):
        mc.materialize(entry, name=name, num_shards=2, workers=workers)
    with pytest.raises(CacheNotFoundError):
        mc.info(name)


def test_a_daemon_whose_python_has_no_tensorflow_says_so_and_how_to_get_it(
    tmp_path: Path, name: str
) -> None:
    # the daemon image's Python (EXTRAS=s3): tensorflow cannot be imported in the workers
    missing = tmp_path / "no-tf" / "tensorflow"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n"
    )
    d = Daemon(extra_args=("--pythonpath", str(missing.parent), *ALLOW)).start()
    try:
        with CacheClient(d.unix_target) as cc:
            with pytest.raises(
                InvalidArgumentError, match=r"no TensorFlow.*shardcache\[tf-cpu\].*EXTRAS=s3,tf-cpu"
            ):
                cc.materialize("mat_pipelines:records", name=name, num_shards=1, workers=1)
            with pytest.raises(CacheNotFoundError):
                cc.info(name)
    finally:
        d.close()


@pytest.mark.parametrize(
    ("num_shards", "message"),
    [
        (0, "num_shards is 0; it must be at least 1"),
        (10**6, "num_shards is 1,000,000; the limit is 10,000"),
    ],
)
def test_a_shard_count_below_one_or_absurdly_large_is_refused(
    mc: CacheClient, name: str, num_shards: int, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        mc.materialize("mat_pipelines:records", name=name, num_shards=num_shards)


def test_an_entry_point_not_of_the_module_function_form_is_refused(
    mc: CacheClient, name: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"'package\.module:function'"):
        mc.materialize("mat_pipelines.records", name=name, num_shards=1)


def test_a_ready_name_needs_overwrite_which_rebuilds_it(mc: CacheClient, name: str) -> None:
    mc.materialize("mat_pipelines:records", name=name, num_shards=1, workers=1)
    with pytest.raises(CacheExistsError, match=r"already READY.*--overwrite"):
        mc.materialize("mat_pipelines:records", name=name, num_shards=2, workers=1)
    assert mc.info(name).num_elements == 20
    info = mc.materialize(
        "mat_pipelines:records", name=name, num_shards=2, workers=1, overwrite=True
    )
    assert (info.num_shards, info.num_elements) == (2, 41)
    assert_records(mc.dataset(name), 2)


# --------------------------------------------------------------------------- the CLI


def test_the_cli_materializes_with_progress_lines_when_not_on_a_terminal(
    mdaemon: Daemon, name: str
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "cacheserver",
        "materialize",
        "mat_pipelines:records",
        "--name",
        name,
        "--shards",
        "2",
        "--workers",
        "1",
        "--target",
        mdaemon.unix_target,
    ]
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env_without_tf_noise()
    )
    assert run.returncode == 0, run.stderr
    assert f"cache '{name}' READY: 41 elements in 2 shards" in run.stdout
    assert f"materialize/{name}: succeeded  2/2 shards  41 elements" in run.stderr
    again = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env_without_tf_noise()
    )
    assert again.returncode == 1
    assert "already READY" in again.stderr and "--overwrite" in again.stderr
    resumed = subprocess.run(
        [*cmd, "--resume"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env_without_tf_noise(),
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"cache '{name}' READY: 41 elements in 2 shards" in resumed.stdout


def test_on_a_terminal_the_cli_draws_a_progress_bar_and_no_wait_returns_the_operation(
    mdaemon: Daemon, mc: CacheClient, name: str
) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    cmd = [
        sys.executable,
        "-m",
        "cacheserver",
        "materialize",
        "mat_pipelines:records",
        "--name",
        name,
        "--shards",
        "2",
        "--workers",
        "2",
        "--target",
        mdaemon.unix_target,
    ]
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the terminal's last writer closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        run = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=env_without_tf_noise(),
        )
    finally:
        os.close(slave)
        reader.join(30)
        os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert run.returncode == 0, terminal
    assert f"{name}: 100%" in terminal and "2/2" in terminal and "41 elements" in terminal
    assert "materialize/" not in terminal, "no log lines on a terminal, only the bar"

    other = f"{name}-nowait"
    started = subprocess.run(
        [*cmd[:6], other, *cmd[7:], "--no-wait"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env_without_tf_noise(),
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"materialize/{other}"
    progress = mc.materialize(
        "mat_pipelines:records", name=other, num_shards=2, wait=False, resume=True
    ).wait(timeout=300)
    assert (progress.state, progress.elements) == ("SUCCEEDED", 41)


def test_materialized_shards_of_small_elements_end_in_short_blocks_and_read_back_exactly(
    mc: CacheClient, name: str
) -> None:
    info = mc.materialize(
        "mat_pipelines:fixed", name=name, num_shards=3, workers=2, block_bytes=64 << 10
    )
    assert info.num_elements == 130 + 131 + 132
    assert '"block_elements":63' in mc._get(name).layout_json
    want = [s * 1000 + i for s in range(3) for i in range(130 + s)]

    def ids(ds: tf.data.Dataset) -> list[int]:
        out = []
        for e in ds.as_numpy_iterator():
            assert (e["x"] == e["id"]).all()
            out.append(int(e["id"]))
        return out

    assert ids(mc.dataset(name)) == want
    assert [
        i for w in range(4) for i in ids(mc.dataset(name, worker_index=w, num_workers=4))
    ] == want
    assert sorted(ids(mc.dataset(name, shuffle=True, seed=2))) == want


def test_block_bytes_sets_the_materialized_block_size_and_zero_stores_one_element_per_value(
    mc: CacheClient, name: str
) -> None:
    want = [s * 1000 + i for s in range(2) for i in range(130 + s)]
    for block_bytes, k in [(0, None), (16 << 10, 15)]:
        mc.materialize(
            "mat_pipelines:fixed",
            name=name,
            num_shards=2,
            workers=2,
            block_bytes=block_bytes,
            overwrite=True,
        )
        layout = json.loads(mc._get(name).layout_json)
        assert layout.get("block_elements") == k, layout  # format 1 names no k
        got = [int(e["id"]) for e in mc.dataset(name).as_numpy_iterator()]
        assert got == want


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_block_bytes_is_refused_by_the_client_before_the_daemon_runs_anything(
    mc: CacheClient, name: str, bad: object
) -> None:
    with pytest.raises(InvalidArgumentError, match="block_bytes must be an int >= 0"):
        mc.materialize("mat_pipelines:fixed", name=name, num_shards=2, block_bytes=bad)
    with pytest.raises(CacheNotFoundError):
        mc.info(name)


def test_a_block_size_over_the_daemons_limit_is_refused_naming_it(
    mc: CacheClient, name: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="the limit is 67,108,864"):
        mc.materialize("mat_pipelines:fixed", name=name, num_shards=2, block_bytes=1 << 30)
