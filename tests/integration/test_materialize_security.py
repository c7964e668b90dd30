"""Materialization runs only what the operator allowed, in workers that cannot kill the daemon.

Issue 16, finding 3: any client could have the daemon run any importable
function (``os:kill`` killed the daemon itself, its workers sharing the daemon's
process group); finding 10: a shipped pipeline reads any file the daemon can.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from daemon import Daemon
from waits import wait_until
from wire import stub

tf = pytest.importorskip("tensorflow")

from materializing import PIPELINES, mat_pipelines, workers_of  # noqa: E402

from client import (  # noqa: E402
    CacheClient,
    CacheNotFoundError,
    InvalidArgumentError,
    MaterializeNotAllowedError,
    PipelineError,
)
from client.wire.v1 import cache_service_pb2 as pb  # noqa: E402


def assert_healthy(daemon: Daemon, cc: CacheClient) -> None:
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log()
    cc.list()  # answers


def _daemon(*args: str, env: dict[str, str] | None = None) -> Daemon:
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})  # the daemon inherits it
    try:
        return Daemon(extra_args=("--pythonpath", str(PIPELINES), *args)).start()
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def closed() -> Iterator[Daemon]:
    """A daemon started without any allow setting: the default."""
    d = _daemon()
    yield d
    d.close()


@pytest.fixture(scope="module")
def allowing() -> Iterator[Daemon]:
    """A daemon that allows the entry points of tests/pipelines/mat_pipelines.py only."""
    d = _daemon("--materialize-allow", "mat_pipelines")
    yield d
    d.close()


# --------------------------------------------------------------------------- allow list


def test_by_default_every_entry_point_is_refused_and_the_message_says_which_flag_to_set(
    closed: Daemon, name: str
) -> None:
    with CacheClient(closed.unix_target) as cc:
        with pytest.raises(
            MaterializeNotAllowedError,
            match=r"'mat_pipelines:records' is not allowed.*"
            r"--materialize-allow mat_pipelines.*"
            r"CACHESERVER_MATERIALIZE_ALLOW",
        ) as err:
            cc.materialize("mat_pipelines:records", name=name, num_shards=1)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(CacheNotFoundError):
            cc.info(name)
    assert workers_of(closed.proc.pid) == []
    assert not (closed.data_dir / "caches" / name).exists()


def test_os_kill_as_an_entry_point_is_refused_before_anything_is_imported_or_started(
    closed: Daemon, allowing: Daemon, name: str
) -> None:
    for daemon in (closed, allowing):
        with CacheClient(daemon.unix_target) as cc:
            with pytest.raises(MaterializeNotAllowedError, match=r"'os:kill' is not allowed"):
                cc.materialize("os:kill", name=name, num_shards=1, workers=1)
            assert workers_of(daemon.proc.pid) == []
            assert_healthy(daemon, cc)


def test_an_entry_point_outside_the_allow_list_is_refused_with_permission_denied(
    allowing: Daemon, name: str
) -> None:
    with CacheClient(allowing.unix_target) as cc:
        # a module that only shares the allowed one's prefix is another module
        with pytest.raises(
            MaterializeNotAllowedError,
            match=r"'mat_pipelines_evil:fn' is not allowed.*"
            r"allowed: mat_pipelines",
        ):
            cc.materialize("mat_pipelines_evil:fn", name=name, num_shards=1)
        # a submodule of an allowed one passes the check (and here fails to import)
        with pytest.raises(
            InvalidArgumentError,
            match=r"cannot import entry point "
            r"'mat_pipelines.sub:fn'",
        ):
            cc.materialize("mat_pipelines.sub:fn", name=name, num_shards=1, workers=1)


def test_an_allowed_module_cannot_be_used_to_reach_a_function_of_another_module(
    allowing: Daemon, name: str
) -> None:
    with CacheClient(allowing.unix_target) as cc:
        with pytest.raises(
            MaterializeNotAllowedError,
            match=r"'mat_pipelines:os.kill' resolves to .*kill, which is not "
            r"defined in an allowed module",
        ):
            cc.materialize("mat_pipelines:os.kill", name=name, num_shards=1, workers=1)
        with pytest.raises(MaterializeNotAllowedError, match=r"dunder"):
            cc.materialize("mat_pipelines:records.__globals__", name=name, num_shards=1)
        assert_healthy(allowing, cc)
        with pytest.raises(CacheNotFoundError):
            cc.info(name)


# --------------------------------------------------------------------------- shipped pipelines


def test_a_shipped_pipeline_is_refused_unless_the_daemon_allows_shipped_pipelines(
    closed: Daemon, allowing: Daemon, name: str
) -> None:
    ds = tf.data.Dataset.range(10)
    for daemon in (closed, allowing):
        with CacheClient(daemon.unix_target) as cc:
            with pytest.raises(
                MaterializeNotAllowedError,
                match=r"does not run shipped pipelines.*"
                r"--allow-shipped-pipelines.*reads? any file",
            ):
                cc.materialize(ds, name=name, num_shards=2)
            assert workers_of(daemon.proc.pid) == []


def test_with_shipped_pipelines_allowed_a_graph_runs_but_entry_points_stay_refused(
    name: str,
) -> None:
    daemon = _daemon(env={"CACHESERVER_ALLOW_SHIPPED_PIPELINES": "true"})
    try:
        with CacheClient(daemon.unix_target) as cc:
            info = cc.materialize(tf.data.Dataset.range(10), name=name, num_shards=2, workers=1)
            assert info.num_elements == 10
            with pytest.raises(MaterializeNotAllowedError, match="--materialize-allow"):
                cc.materialize("mat_pipelines:records", name=name + "-e", num_shards=1)
    finally:
        daemon.close()


# --------------------------------------------------------------------------- worker isolation


def test_workers_run_in_a_session_and_process_group_of_their_own(
    allowing: Daemon, name: str
) -> None:
    with CacheClient(allowing.unix_target) as cc:
        cc.materialize("mat_pipelines:reports_its_session", name=name, num_shards=1, workers=1)
        [(pid, sid, pgid, ppid)] = [tuple(e) for e in cc.dataset(name).as_numpy_iterator()]
    daemon_pid = allowing.proc.pid
    assert ppid == daemon_pid, "the daemon is still the worker's parent (PR_SET_PDEATHSIG)"
    assert sid == pgid == pid, "the worker leads a session and process group of its own"
    assert pgid != os.getpgid(daemon_pid) and sid != os.getsid(daemon_pid)


@pytest.mark.parametrize(
    "entry", ["mat_pipelines:kills_its_process_group", "mat_pipelines:kills_process_group_zero"]
)
def test_a_pipeline_that_kills_its_process_group_fails_its_operation_and_the_daemon_lives(
    allowing: Daemon, name: str, entry: str
) -> None:
    with CacheClient(allowing.unix_target) as cc:
        with pytest.raises(
            PipelineError,
            match=r"worker process 0 was killed by SIGKILL .*the pipeline "
            r"may have killed it",
        ):
            cc.materialize(entry, name=name, num_shards=1, workers=1)
        assert_healthy(allowing, cc)
        with pytest.raises(CacheNotFoundError):
            cc.info(name)
        info = cc.materialize("mat_pipelines:records", name=name, num_shards=2, workers=1)
        assert info.num_elements == 20 + 21


# --------------------------------------------------------------------------- resumption


def test_an_interrupted_materialization_no_longer_allowed_fails_at_start_and_is_not_run(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"  # never opened: shards >= 2 wait part way
    daemon = _daemon(
        "--materialize-allow", "mat_pipelines", env={mat_pipelines.GATE_ENV: str(gate)}
    )
    try:
        with CacheClient(daemon.unix_target) as cc:
            op = cc.materialize(
                "mat_pipelines:gated", name="interrupted", num_shards=4, workers=2, wait=False
            )
            cache_dir = daemon.data_dir / "caches" / "interrupted"
            wait_until(lambda: op.progress().shards_done == 2, 120, "two shards committed")
            workers = workers_of(daemon.proc.pid)
        daemon.kill()  # SIGKILL: the workers must die with it (PR_SET_PDEATHSIG)
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, "workers must die with the daemon"
        assert (cache_dir / "materialize.json").exists()

        daemon.extra_args = ("--pythonpath", str(PIPELINES))  # the operator withdrew it
        daemon.start()
        with grpc.insecure_channel(daemon.unix_target) as channel:
            got = (
                stub(channel)
                .GetOperation(pb.GetOperationRequest(name="materialize/interrupted"), timeout=10)
                .operation
            )
        assert got.done and got.state == pb.OPERATION_STATE_FAILED
        assert got.error.reason == MaterializeNotAllowedError.reason
        assert "--materialize-allow mat_pipelines" in got.error.message
        assert workers_of(daemon.proc.pid) == []
        assert not cache_dir.exists()
        assert "not resumed" in daemon.log()
        with CacheClient(daemon.unix_target) as cc, pytest.raises(CacheNotFoundError):
            cc.info("interrupted")
    finally:
        daemon.close()
