"""The plain parts of materialization: what is persisted, progress lines, error mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheserver.catalog.catalog import Catalog
from cacheserver.materialize.materializer import Materializer
from cacheserver.materialize.operation import Spec
from client import (
    CacheExistsError,
    DiskFullError,
    OperationCancelledError,
    PipelineError,
    ServerUnavailableError,
)
from client._materialize import Progress, ProgressDisplay, operation_error
from client.wire.status import CacheExists, InvalidArgument
from client.wire.v1 import cache_service_pb2 as pb


def test_the_persisted_spec_round_trips_including_a_binary_graph() -> None:
    spec = Spec("", bytes(range(256)), b"\x00spec", 7, 2, "graph:abc/shards=7")
    assert Spec.from_json(spec.to_json()) == spec


def _progress(done: bool = False, eta: float = 252.0) -> Progress:
    op = pb.Operation(
        name="materialize/x",
        cache="x",
        done=done,
        shards_total=64,
        shards_done=31,
        elements=812_204,
        stored_bytes=int(38.1 * 2**30),
        bytes_per_second=412 * 2**20,
        eta_seconds=eta,
        state=pb.OPERATION_STATE_SUCCEEDED if done else pb.OPERATION_STATE_RUNNING,
    )
    return Progress.from_proto(op)


def test_a_progress_line_reads_like_the_issue_asks() -> None:
    assert _progress().line() == "31/64 shards  812,204 elements  38.1 GiB  412.0 MiB/s  ETA 4m12s"
    assert _progress(eta=-1).line().endswith("ETA ?")


def test_off_a_terminal_progress_is_a_line_every_few_seconds_and_one_at_the_end() -> None:
    lines: list[str] = []
    display = ProgressDisplay(lines.append)
    for _ in range(5):
        display.update(_progress())
    assert len(lines) == 1, "updates within LOG_EVERY seconds are not repeated"
    display.update(_progress(done=True))
    assert lines[-1].startswith("materialize/x: succeeded  31/64 shards")
    silent: list[str] = []
    ProgressDisplay(silent.append, enabled=False).update(_progress(done=True))
    assert silent == []


@pytest.mark.parametrize(
    ("reason", "code", "cls"),
    [
        ("PIPELINE_FAILED", 2, PipelineError),
        ("DISK_FULL", 8, DiskFullError),
        ("OPERATION_CANCELLED", 1, OperationCancelledError),
        ("SHUTTING_DOWN", 14, ServerUnavailableError),
    ],
)
def test_an_operation_error_becomes_the_matching_client_exception(
    reason: str, code: int, cls: type
) -> None:
    op = pb.Operation(
        name="materialize/x",
        done=True,
        state=pb.OPERATION_STATE_FAILED,
        error=pb.OperationError(code=code, reason=reason, message="why"),
    )
    err = operation_error(op)
    assert type(err) is cls and str(err) == "why"


def test_starting_checks_the_request_before_anything_runs(tmp_path: Path) -> None:
    m = Materializer(Catalog(tmp_path))
    with pytest.raises(InvalidArgument, match="exactly one of"):
        m.start("x", num_shards=1)
    with pytest.raises(InvalidArgument, match="at least 1"):
        m.start("x", entry_point="a.b:c", num_shards=0)
    with pytest.raises(InvalidArgument, match="workers is 1000"):
        m.start("x", entry_point="a.b:c", num_shards=4, workers=1000)
    with pytest.raises(InvalidArgument, match="needs its element_spec"):
        m.start("x", graph_def=b"g", num_shards=4)
    assert m.catalog.list() == []


def test_a_ready_name_is_not_replaced_without_overwrite(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path)
    _, _, session = catalog.begin_write("x", "fp", "{}", b"")
    assert session is not None
    session.finish(0)
    with pytest.raises(CacheExists, match="--overwrite"):
        catalog.begin_materialize("x", "fp2", "{}", overwrite=False)
    assert CacheExistsError.reason == CacheExists.reason
