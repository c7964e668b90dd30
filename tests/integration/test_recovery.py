"""Startup recovery: kill -9 mid-write, one daemon per data dir, read-only data dirs."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from daemon import Daemon
from mounts import mounted_tmpfs
from wire import names, read_all, records, stub, write_cache, write_requests

from cacheserver.catalog.leases import TOKEN_FILE
from cacheserver.catalog.recovery import LOCK_FILE
from client.wire.v1 import cache_service_pb2 as pb


def test_a_daemon_killed_mid_write_restarts_with_intact_caches_and_says_what_it_found(
    fresh_daemon: Daemon,
) -> None:
    kept = records(8, 64 << 10, 1)
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        write_cache(ch, "kept", kept)
        requests = write_requests("torn", records(64, 64 << 10, 2))
        call = stub(ch).WriteCache(requests)
        assert next(call).begun.decision == pb.WRITE_DECISION_ACCEPTED
        torn = fresh_daemon.data_dir / "caches" / "torn"
        assert torn.is_dir()
        fresh_daemon.kill()  # SIGKILL while the write stream is open
        with pytest.raises(grpc.RpcError):
            list(call)
    fresh_daemon.start()
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        assert names(ch) == ["kept"]
        assert read_all(ch, "kept") == kept
    assert not torn.exists()
    summary = [line for line in fresh_daemon.log().splitlines() if "recovered " in line][-1]
    assert "kept 1 caches" in summary and "discarded 1 interrupted writes" in summary, summary


def test_temporary_files_a_crash_left_mid_update_are_removed_at_start_and_caches_kept(
    fresh_daemon: Daemon,
) -> None:
    kept = records(8, 64 << 10, 3)
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        write_cache(ch, "kept", kept)
    fresh_daemon.kill()  # SIGKILL, then what one between write_atomic's write and rename leaves
    cache_dir = fresh_daemon.data_dir / "caches" / "kept"
    left = [
        cache_dir / f".retention.json.{uuid.uuid4().hex}.tmp",
        cache_dir / f".manifest.json.{uuid.uuid4().hex}.tmp",
        fresh_daemon.data_dir / f".{TOKEN_FILE}.{uuid.uuid4().hex}.tmp",
    ]
    for path in left:
        path.write_text('{"half": ')
    mine = cache_dir / ".keep.tmp"  # not write_atomic's name: not the daemon's to remove
    mine.write_text("x")
    fresh_daemon.start()
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        assert names(ch) == ["kept"]
        assert read_all(ch, "kept") == kept
    assert not any(path.exists() for path in left) and mine.exists()
    summary = [line for line in fresh_daemon.log().splitlines() if "recovered " in line][-1]
    assert "removed 3 temporary files of interrupted updates" in summary, summary


def test_a_second_daemon_on_the_same_data_dir_refuses_to_start_and_touches_nothing(
    fresh_daemon: Daemon,
) -> None:
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        data = records(4, 4096)
        write_cache(ch, "mine", data)
        # a WRITING cache the second daemon's recovery would discard, were it allowed to run
        call = stub(ch).WriteCache(write_requests("in-progress", records(64, 4096)))
        assert next(call).begun.decision == pb.WRITE_DECISION_ACCEPTED
        second = Daemon(data_dir=fresh_daemon.data_dir)
        try:
            result = subprocess.run(second.command, capture_output=True, text=True, timeout=60)
        finally:
            second.close()
        assert result.returncode != 0
        lock = fresh_daemon.data_dir / LOCK_FILE
        assert (
            f"in use by another cacheserver (pid {fresh_daemon.proc.pid}, lock {lock})"
            in result.stderr
        ), result.stderr
        assert (fresh_daemon.data_dir / "caches" / "in-progress").is_dir()
        call.cancel()
        assert read_all(ch, "mine") == data


@pytest.fixture
def read_only_dir() -> Iterator[Path]:
    with mounted_tmpfs("ro,size=1m") as mount:
        yield mount


def test_a_data_dir_on_a_read_only_filesystem_fails_at_start_with_the_reason(
    read_only_dir: Path,
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheserver",
            "serve",
            "--data-dir",
            str(read_only_dir),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"data dir {read_only_dir} is on a read-only filesystem" in result.stderr, result.stderr
