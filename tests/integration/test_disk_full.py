"""A real full disk: a small tmpfs under the daemon's data directory."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from daemon import Daemon

tf = pytest.importorskip("tensorflow")


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def test_a_full_disk_fails_the_write_keeps_training_and_loses_nothing(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from client import CacheClient

    daemon = Daemon(data_dir=small_disk / "data").start()
    try:
        with CacheClient(daemon.unix_target) as cc:
            small = tf.data.Dataset.range(100)
            assert len(list(cc.cache(small, name="small"))) == 100
            free_before = _free_bytes(small_disk)
            rng = np.random.default_rng(0)
            big = tf.data.Dataset.from_tensor_slices(
                rng.integers(0, 256, size=(400, 128 << 10), dtype=np.uint8)
            )  # 50 MiB
            with caplog.at_level(logging.WARNING, logger="client"):
                seen = sum(1 for _ in cc.cache(big, name="big"))
            assert seen == 400, "the epoch must go on from the source pipeline"
            assert any("disk full" in r.getMessage() for r in caplog.records), caplog.text
            assert [c.name for c in cc.list()] == ["small"]
            assert _free_bytes(small_disk) >= free_before - (1 << 20), "space not released"
            assert [int(x) for x in cc.dataset("small")] == list(range(100))
        assert "disk full" in daemon.log()
    finally:
        daemon.close()


def test_a_full_disk_is_a_typed_error_on_the_wire_and_frees_the_failed_write(
    small_disk: Path,
) -> None:
    import grpc
    from wire import names, read_all, reason, records, write_cache

    daemon = Daemon(data_dir=small_disk / "data").start()
    try:
        with grpc.insecure_channel(daemon.unix_target) as ch:
            kept = records(16, 64 << 10, 1)
            write_cache(ch, "kept", kept)
            free_before = _free_bytes(small_disk)
            with pytest.raises(grpc.RpcError) as err:
                write_cache(ch, "overflow", records(240, 128 << 10, 2))  # 30 MiB > 24 MiB
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert reason(err.value) == "DISK_FULL"
            assert "disk full under" in err.value.details()
            assert names(ch) == ["kept"] and read_all(ch, "kept") == kept
            assert _free_bytes(small_disk) >= free_before - (1 << 20), "space not released"
    finally:
        daemon.close()


def test_a_free_space_floor_evicts_unpinned_caches_then_refuses_with_the_numbers(
    small_disk: Path,
) -> None:
    import grpc
    from wire import names, read_all, reason, records, write_cache

    from client import CacheClient

    daemon = Daemon(data_dir=small_disk / "data", extra_args=("--min-free-bytes", "12MiB")).start()
    try:
        with grpc.insecure_channel(daemon.unix_target) as ch, CacheClient(daemon.unix_target) as cc:
            old, pinned = records(40, 128 << 10, 1), records(24, 128 << 10, 2)  # 5, 3 MiB
            write_cache(ch, "old", old)
            write_cache(ch, "pinned", pinned)
            cc.pin("pinned")
            write_cache(ch, "new", records(40, 128 << 10, 3))  # fits only once "old" is gone
            assert names(ch) == ["new", "pinned"]
            cc.pin("new")
            free_before = _free_bytes(small_disk)
            with pytest.raises(grpc.RpcError) as err:
                write_cache(ch, "refused", records(40, 128 << 10, 4))
            assert reason(err.value) == "CAPACITY_EXCEEDED"
            assert "--min-free-bytes is 12,582,912 bytes" in err.value.details()
            assert names(ch) == ["new", "pinned"] and read_all(ch, "pinned") == pinned
            assert _free_bytes(small_disk) >= free_before - (256 << 10), "space not released"
    finally:
        daemon.close()


def _fill(disk: Path) -> Path:
    """Fill the filesystem to the last byte with one file; returns it (delete it for room)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    assert _free_bytes(disk) < 64 << 10
    return filler


def test_a_daemon_starts_on_a_full_disk_serves_its_caches_and_writes_again_once_space_returns(
    small_disk: Path,
) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from waits import wait_until
    from wire import names, read_all, reason, records, write_cache

    daemon = Daemon(data_dir=small_disk / "data")
    daemon.start()
    kept = records(16, 64 << 10, 1)
    with grpc.insecure_channel(daemon.unix_target) as ch:
        write_cache(ch, "kept", kept)
    assert daemon.terminate() == 0
    filler = _fill(small_disk)
    try:
        daemon.start()  # a full disk must not stop the daemon from starting
        with grpc.insecure_channel(daemon.unix_target) as ch:
            assert names(ch) == ["kept"] and read_all(ch, "kept") == kept
            with pytest.raises(grpc.RpcError) as err:
                write_cache(ch, "new", records(8, 64 << 10, 2))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert reason(err.value) == "DISK_FULL"
            health = health_pb2_grpc.HealthStub(ch)
            serving, not_serving = (
                health_pb2.HealthCheckResponse.SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
            assert health.Check(health_pb2.HealthCheckRequest()).status == serving  # reads
            writes = health_pb2.HealthCheckRequest(service="shardcache.writes")
            assert health.Check(writes).status == not_serving
            filler.unlink()  # space returns: writes go on without a restart
            new = records(8, 64 << 10, 3)
            write_cache(ch, "new", new)
            wait_until(lambda: health.Check(writes).status == serving, 30)
            assert names(ch) == ["kept", "new"] and read_all(ch, "new") == new
        assert "serving reads of READY caches; writes fail with DISK_FULL" in daemon.log()
        assert "writes accepted again" in daemon.log()
    finally:
        filler.unlink(missing_ok=True)
        daemon.close()
