"""Server-side materialization: a real daemon runs entry points in spawned workers."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from daemon import Daemon, env_without_tf_noise, free_port
from waits import wait_until

tf = pytest.importorskip("tensorflow")

from client import (  # noqa: E402
    CacheClient,
    CacheExistsError,
    CacheNotFoundError,
    CacheNotReadyError,
    DiskFullError,
    InvalidArgumentError,
    OperationCancelledError,
    PipelineError,
)

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "tests" / "pipelines"
sys.path.insert(0, str(PIPELINES))

import mat_pipelines  # noqa: E402

#: What these tests' daemons allow: the test pipelines (and a module that is not there, to
#: show an import error), and shipped graphs (tests/integration/test_materialize_security.py
#: covers the refusals).
ALLOW = ("--pythonpath", str(PIPELINES), "--materialize-allow", "mat_pipelines,no_such_module",
         "--allow-shipped-pipelines")


def materializing_daemon(gate: Path, data_dir: Path | None = None) -> Daemon:
    """A daemon whose workers find tests/pipelines and whose gated() waits for gate."""
    os.environ[mat_pipelines.GATE_ENV] = str(gate)  # the daemon inherits it
    try:
        return Daemon(data_dir=data_dir, extra_args=ALLOW).start()
    finally:
        del os.environ[mat_pipelines.GATE_ENV]


@pytest.fixture(scope="module")
def mdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = materializing_daemon(tmp_path_factory.mktemp("gate") / "never-opened")
    yield d
    d.close()


@pytest.fixture
def mc(mdaemon: Daemon) -> Iterator[CacheClient]:
    with CacheClient(mdaemon.unix_target) as client:
        yield client


def elements(ds: tf.data.Dataset) -> list[dict]:
    return list(ds.as_numpy_iterator())


def assert_same_elements(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.keys() == b.keys(), i
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"element {i}, {key!r}")


def expected_records(num_shards: int) -> list[dict]:
    out: list[dict] = []
    for shard in range(num_shards):
        out += elements(mat_pipelines.records(shard, num_shards))
    return out


def workers_of(pid: int) -> list[psutil.Process]:
    """The daemon's materialization workers (not multiprocessing's resource tracker)."""
    return [p for p in psutil.Process(pid).children()
            if "spawn_main" in " ".join(p.cmdline())]


# --------------------------------------------------------------------------- happy paths

def test_an_entry_point_is_materialized_in_shard_order_and_reads_back_element_for_element(
        mc: CacheClient, mdaemon: Daemon, name: str) -> None:
    info = mc.materialize("mat_pipelines:records", name=name, num_shards=3, workers=2)
    assert (info.state, info.num_shards, info.num_elements) == ("READY", 3, 20 + 21 + 22)
    assert_same_elements(elements(mc.dataset(name)), expected_records(3))
    assert "libtensorflow" not in Path(f"/proc/{mdaemon.proc.pid}/maps").read_text(), \
        "the daemon itself must not load TensorFlow; only its workers do"


def test_a_dataset_built_from_tf_ops_is_shipped_as_a_graph_and_sharded_by_the_daemon(
        mc: CacheClient, name: str) -> None:
    ds = tf.data.Dataset.range(50).map(lambda x: (x * x, tf.strings.as_string(x)))
    info = mc.materialize(ds, name=name, num_shards=4, workers=2)
    want = [e for i in range(4) for e in ds.shard(4, i).as_numpy_iterator()]
    assert info.num_elements == 50
    assert list(mc.dataset(name).as_numpy_iterator()) == want


def test_a_pipeline_running_python_code_is_refused_with_the_ways_that_work(
        mc: CacheClient, name: str) -> None:
    ds = tf.data.Dataset.range(5).map(lambda x: tf.py_function(lambda y: y, [x], tf.int64))
    with pytest.raises(InvalidArgumentError, match=r"(?s)cannot be shipped.*entry point.*"
                                                   r"cc\.cache\(ds"):
        mc.materialize(ds, name=name, num_shards=2)
    with pytest.raises(CacheNotFoundError):
        mc.info(name)


def test_progress_is_watched_a_ready_cache_keeps_serving_and_cancel_stops_the_workers(
        mc: CacheClient, mdaemon: Daemon, name: str) -> None:
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
    assert_same_elements(elements(mc.dataset(ready)), expected_records(1))
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

@pytest.mark.parametrize(("entry", "error", "message"), [
    ("no_such_module:fn", InvalidArgumentError,
     r"cannot import entry point 'no_such_module:fn'.*--pythonpath"),
    ("mat_pipelines:missing", InvalidArgumentError, r"has no attribute 'missing'"),
    ("mat_pipelines:NOT_CALLABLE", InvalidArgumentError, r"is a int, not a function"),
    ("mat_pipelines:not_a_dataset", InvalidArgumentError,
     r"returned builtins.list for shard \d; it must return a tf.data.Dataset"),
    ("mat_pipelines:mixed_specs", InvalidArgumentError,
     r"shard \d yields elements of another spec than shard \d.*float32"),
    ("mat_pipelines:infinite", InvalidArgumentError, r"infinite; drop the .repeat\(\)"),
    ("mat_pipelines:raises", PipelineError,
     r"shard 1: the pipeline raised FileNotFoundError: source file "
     r"/data/part-00001.tfrecord is missing"),
    ("mat_pipelines:fails_while_reading", PipelineError, r"shard 1: .*label out of range"),
])
def test_a_bad_pipeline_fails_the_operation_with_a_clear_message_and_leaves_no_cache(
        mc: CacheClient, name: str, entry: str, error: type, message: str) -> None:
    with pytest.raises(error, match=f"(?s){message}"):
        mc.materialize(entry, name=name, num_shards=2, workers=2)
    with pytest.raises(CacheNotFoundError):
        mc.info(name)


@pytest.mark.parametrize(("num_shards", "message"), [
    (0, "num_shards is 0; it must be at least 1"),
    (10**6, "num_shards is 1,000,000; the limit is 10,000"),
])
def test_a_shard_count_below_one_or_absurdly_large_is_refused(
        mc: CacheClient, name: str, num_shards: int, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        mc.materialize("mat_pipelines:records", name=name, num_shards=num_shards)


def test_an_entry_point_not_of_the_module_function_form_is_refused(
        mc: CacheClient, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"'package\.module:function'"):
        mc.materialize("mat_pipelines.records", name=name, num_shards=1)


def test_a_ready_name_needs_overwrite_which_rebuilds_it(mc: CacheClient, name: str) -> None:
    mc.materialize("mat_pipelines:records", name=name, num_shards=1, workers=1)
    with pytest.raises(CacheExistsError, match=r"already READY.*--overwrite"):
        mc.materialize("mat_pipelines:records", name=name, num_shards=2, workers=1)
    assert mc.info(name).num_elements == 20
    info = mc.materialize("mat_pipelines:records", name=name, num_shards=2, workers=1,
                          overwrite=True)
    assert (info.num_shards, info.num_elements) == (2, 41)
    assert_same_elements(elements(mc.dataset(name)), expected_records(2))


# --------------------------------------------------------------------------- the CLI

def test_the_cli_materializes_with_progress_lines_when_not_on_a_terminal(
        mdaemon: Daemon, name: str) -> None:
    cmd = [sys.executable, "-m", "cacheserver", "materialize", "mat_pipelines:records",
           "--name", name, "--shards", "2", "--workers", "1", "--target", mdaemon.unix_target]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=env_without_tf_noise())
    assert run.returncode == 0, run.stderr
    assert f"cache '{name}' READY: 41 elements in 2 shards" in run.stdout
    assert f"materialize/{name}: succeeded  2/2 shards  41 elements" in run.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env=env_without_tf_noise())
    assert again.returncode == 1
    assert "already READY" in again.stderr and "--overwrite" in again.stderr
    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=120,
                             cwd=ROOT, env=env_without_tf_noise())
    assert resumed.returncode == 0, resumed.stderr
    assert f"cache '{name}' READY: 41 elements in 2 shards" in resumed.stdout


def test_on_a_terminal_the_cli_draws_a_progress_bar_and_no_wait_returns_the_operation(
        mdaemon: Daemon, mc: CacheClient, name: str) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    cmd = [sys.executable, "-m", "cacheserver", "materialize", "mat_pipelines:records",
           "--name", name, "--shards", "2", "--workers", "2", "--target", mdaemon.unix_target]
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
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=300,
                             cwd=ROOT, env=env_without_tf_noise())
    finally:
        os.close(slave)
        reader.join(30)
        os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert run.returncode == 0, terminal
    assert f"{name}: 100%" in terminal and "2/2" in terminal and "41 elements" in terminal
    assert "materialize/" not in terminal, "no log lines on a terminal, only the bar"

    other = f"{name}-nowait"
    started = subprocess.run([*cmd[:6], other, *cmd[7:], "--no-wait"], capture_output=True,
                             text=True, timeout=120, cwd=ROOT, env=env_without_tf_noise())
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"materialize/{other}"
    progress = mc.materialize("mat_pipelines:records", name=other, num_shards=2,
                              wait=False, resume=True).wait(timeout=300)
    assert (progress.state, progress.elements) == ("SUCCEEDED", 41)


# --------------------------------------------------------------------------- crash recovery

def test_a_daemon_killed_mid_materialization_resumes_and_builds_the_same_cache(
        tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    daemon = materializing_daemon(gate)
    try:
        with CacheClient(daemon.unix_target) as cc:
            op = cc.materialize("mat_pipelines:gated", name="crashed", num_shards=4, workers=2,
                                wait=False)
            cache_dir = daemon.data_dir / "caches" / "crashed"
            wait_until(lambda: op.progress().shards_done == 2
                       and (cache_dir / "shard-00002").is_dir()
                       and (cache_dir / "shard-00003").is_dir(),
                       120, "two shards committed, two being written")
            workers = workers_of(daemon.proc.pid)
        daemon.kill()  # SIGKILL: nothing gets to clean up
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, "workers must die with the daemon"
        assert (cache_dir / "shard-00001.json").exists()
        assert not (cache_dir / "shard-00002.json").exists()
        assert (cache_dir / "shard-00002" / "data.mdb").exists()

        gate.touch()
        daemon.start()  # resumes on its own
        with CacheClient(daemon.unix_target) as cc:
            assert cc.info("crashed").state in ("WRITING", "READY")
            op = cc.materialize("mat_pipelines:gated", name="crashed", num_shards=4,
                                workers=2, wait=False, resume=True)
            progress = op.wait(timeout=300)
            assert (progress.state, progress.shards_resumed) == ("SUCCEEDED", 2)
            assert "resuming materialization of cache 'crashed': 2 of 4" in daemon.log()
            resumed = elements(cc.dataset("crashed"))
            cc.materialize("mat_pipelines:gated", name="uninterrupted", num_shards=4,
                           workers=2)
            assert_same_elements(resumed, elements(cc.dataset("uninterrupted")))
            assert_same_elements(resumed, expected_records(4))
    finally:
        daemon.close()


def test_a_sigterm_stops_the_workers_keeps_committed_shards_and_the_restart_resumes(
        tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    daemon = materializing_daemon(gate)
    try:
        with CacheClient(daemon.unix_target) as cc:
            op = cc.materialize("mat_pipelines:gated", name="stopped", num_shards=4, workers=2,
                                wait=False)
            wait_until(lambda: op.progress().shards_done == 2, 120, "two shards committed")
            workers = workers_of(daemon.proc.pid)
        assert daemon.terminate() == 0
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive
        assert "the daemon shut down during materialize/stopped" in daemon.log()
        gate.touch()
        daemon.start()
        with CacheClient(daemon.unix_target) as cc:
            progress = cc.materialize("mat_pipelines:gated", name="stopped", num_shards=4,
                                      workers=2, wait=False, resume=True).wait(timeout=300)
            assert (progress.state, progress.shards_resumed) == ("SUCCEEDED", 2)
            assert_same_elements(elements(cc.dataset("stopped")), expected_records(4))
    finally:
        daemon.close()


# --------------------------------------------------------------------------- full disk


def test_a_full_disk_fails_the_operation_releases_its_space_and_keeps_other_caches(
        small_disk: Path, tmp_path: Path) -> None:
    daemon = materializing_daemon(tmp_path / "gate", data_dir=small_disk / "data")
    try:
        with CacheClient(daemon.unix_target) as cc:
            cc.materialize("mat_pipelines:records", name="small", num_shards=1, workers=1)
            free_before = shutil.disk_usage(small_disk).free
            with pytest.raises(DiskFullError, match=r"shard \d: disk full under .*free space"):
                cc.materialize("mat_pipelines:big", name="big", num_shards=4, workers=2)
            assert [c.name for c in cc.list()] == ["small"]
            assert shutil.disk_usage(small_disk).free >= free_before - (1 << 20), \
                "the failed shards' space must be released"
            assert_same_elements(elements(cc.dataset("small")), expected_records(1))
        assert "DISK_FULL" in daemon.log() or "disk full" in daemon.log()
    finally:
        daemon.close()


def test_materialization_counts_against_max_bytes_evicts_to_fit_and_shows_in_metrics(
        tmp_path: Path) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from client import CapacityExceededError

    port = free_port()
    os.environ[mat_pipelines.GATE_ENV] = str(tmp_path / "gate")
    try:
        daemon = Daemon(extra_args=(*ALLOW, "--max-bytes", "20MiB",
                                    "--metrics-listen", f"127.0.0.1:{port}")).start()
    finally:
        del os.environ[mat_pipelines.GATE_ENV]

    def metric(name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == name and s.labels == labels)

    try:
        with CacheClient(daemon.unix_target) as cc:
            cc.materialize("mat_pipelines:records", name="small", num_shards=1, workers=1)
            cc.materialize("mat_pipelines:big", name="big", num_shards=2, workers=2)  # 16 MiB
            # 16 MiB more does not fit beside "big": the least recently used go, "small" first
            cc.materialize("mat_pipelines:big", name="big2", num_shards=2, workers=2)
            assert [c.name for c in cc.list()] == ["big2"]
            cc.pin("big2")
            with pytest.raises(CapacityExceededError, match=r"--max-bytes is 20,971,520 bytes"):
                cc.materialize("mat_pipelines:big", name="big3", num_shards=2, workers=2)
            assert [c.name for c in cc.list()] == ["big2"]
            assert cc.info("big2").num_elements == 128
            assert metric("shardcache_materializations_total", state="SUCCEEDED") == 3
            assert metric("shardcache_materializations_total", state="FAILED") == 1
            assert metric("shardcache_evictions_total", reason="capacity") == 2
            assert metric("shardcache_materialized_shards_total") >= 5
            assert metric("shardcache_materialized_elements_total") >= 20 + 3 * 64
            assert metric("shardcache_materialized_bytes_total") >= 3 * (8 << 20)
            assert metric("shardcache_disk_bytes") <= 20 << 20
    finally:
        daemon.close()


def test_materialized_shards_of_small_elements_end_in_short_blocks_and_read_back_exactly(
        mc: CacheClient, name: str) -> None:
    info = mc.materialize("mat_pipelines:fixed", name=name, num_shards=3, workers=2,
                          block_bytes=64 << 10)
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
    assert [i for w in range(4) for i in ids(mc.dataset(name, worker_index=w, num_workers=4))
            ] == want
    assert sorted(ids(mc.dataset(name, shuffle=True, seed=2))) == want


def test_block_bytes_sets_the_materialized_block_size_and_zero_stores_one_element_per_value(
        mc: CacheClient, name: str) -> None:
    want = [s * 1000 + i for s in range(2) for i in range(130 + s)]
    for block_bytes, k in [(0, None), (16 << 10, 15)]:
        mc.materialize("mat_pipelines:fixed", name=name, num_shards=2, workers=2,
                       block_bytes=block_bytes, overwrite=True)
        layout = json.loads(mc._get(name).layout_json)
        assert layout.get("block_elements") == k, layout  # format 1 names no k
        got = [int(e["id"]) for e in mc.dataset(name).as_numpy_iterator()]
        assert got == want


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_block_bytes_is_refused_by_the_client_before_the_daemon_runs_anything(
        mc: CacheClient, name: str, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="block_bytes must be an int >= 0"):
        mc.materialize("mat_pipelines:fixed", name=name, num_shards=2, block_bytes=bad)
    with pytest.raises(CacheNotFoundError):
        mc.info(name)


def test_a_block_size_over_the_daemons_limit_is_refused_naming_it(
        mc: CacheClient, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="the limit is 67,108,864"):
        mc.materialize("mat_pipelines:fixed", name=name, num_shards=2, block_bytes=1 << 30)
