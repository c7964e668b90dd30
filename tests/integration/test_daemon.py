"""The daemon process: listeners, health, reflection, SIGTERM drain, bad flags."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import grpc
import pytest
from daemon import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from waits import wait_until
from wire import LAYOUT

from cacheserver.launch import NotHealthy, wait_healthy
from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc


def test_health_and_reflection_answer_on_tcp_and_unix(daemon: Daemon) -> None:
    for target in (daemon.unix_target, daemon.tcp_target):
        with grpc.insecure_channel(target) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="cacheserver.v1.CacheService"), timeout=5
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            responses = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            names = {s.name for r in responses for s in r.list_services_response.service}
            assert "cacheserver.v1.CacheService" in names


def test_the_unix_socket_is_group_accessible_only(daemon: Daemon) -> None:
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o660


def test_sigterm_lets_an_in_flight_stream_finish_then_exits_zero(fresh_daemon: Daemon) -> None:
    stub_channel = grpc.insecure_channel(fresh_daemon.unix_target)
    stub = pb_grpc.CacheServiceStub(stub_channel)
    # write a cache of ~8 MiB so a read takes several chunks
    chunk = pb.WriteChunk(lengths=(b"\x00\x00\x01\x00" * 8), data=b"\x00" * (8 << 16))

    def requests():
        yield pb.WriteCacheRequest(
            begin=pb.WriteBegin(name="c", fingerprint="f", layout_json=LAYOUT)
        )
        for _ in range(16):
            yield pb.WriteCacheRequest(chunk=chunk)
        yield pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=128))

    list(stub.WriteCache(requests()))
    stream = stub.ReadShard(pb.ReadShardRequest(name="c", shard=0, chunk_bytes=65536))
    first = next(stream)
    code = {}
    waiter = threading.Thread(target=lambda: code.setdefault("rc", fresh_daemon.terminate()))
    waiter.start()
    received = len(first.data) + sum(len(r.data) for r in stream)
    waiter.join(60)
    assert received == 128 * 65536
    assert code["rc"] == 0
    # new calls are refused once it is gone
    with pytest.raises(grpc.RpcError):
        stub.ListCaches(pb.ListCachesRequest(), timeout=2)
    stub_channel.close()


def test_a_restarted_daemon_serves_the_caches_it_had(fresh_daemon: Daemon) -> None:
    from client import CacheClient

    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        stub = pb_grpc.CacheServiceStub(ch)
        reqs = [
            pb.WriteCacheRequest(
                begin=pb.WriteBegin(name="kept", fingerprint="f", layout_json=LAYOUT)
            ),
            pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=0)),
        ]
        list(stub.WriteCache(iter(reqs)))
    fresh_daemon.restart()
    with CacheClient(fresh_daemon.unix_target) as cc:
        assert [c.name for c in cc.list()] == ["kept"]


def test_a_malformed_listen_address_is_a_clear_error(tmp_path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheserver",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--listen",
            "unix://relative.sock",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "absolute path" in result.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheserver",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--listen",
            "nonsense",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "HOST:PORT" in result.stderr


def test_a_socket_in_a_directory_that_cannot_be_made_is_a_clear_error(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    socket = blocker / "sub" / "cache.sock"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "cacheserver", "serve"),
            *("--data-dir", str(tmp_path / "data"), "--listen", f"unix://{socket}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: cannot listen on unix://{socket}: "), last
    assert "[Errno" not in last and "--listen" in last, last
    assert "Traceback" not in result.stderr


def test_serve_binds_loopback_by_default() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cacheserver", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "127.0.0.1:50051" in result.stdout
    assert "--data-dir" in result.stdout and "--listen" in result.stdout


def test_a_write_stream_that_starts_without_begin_is_rejected(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        stub = pb_grpc.CacheServiceStub(ch)
        call = stub.WriteCache(iter([pb.WriteCacheRequest(finish=pb.WriteFinish())]))
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must start with a WriteBegin" in err.value.details()


def test_a_chunk_with_inconsistent_framing_is_rejected_and_nothing_is_kept(daemon) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        stub = pb_grpc.CacheServiceStub(ch)
        reqs = [
            pb.WriteCacheRequest(
                begin=pb.WriteBegin(name="framing", fingerprint="f", layout_json=LAYOUT)
            ),
            pb.WriteCacheRequest(chunk=pb.WriteChunk(lengths=b"\x10\x00\x00\x00", data=b"short")),
        ]
        with pytest.raises(grpc.RpcError) as err:
            list(stub.WriteCache(iter(reqs)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            stub.GetCache(pb.GetCacheRequest(name="framing"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_wait_healthy_gives_up_on_a_dead_target() -> None:
    with pytest.raises(NotHealthy):
        wait_healthy("unix:///tmp/no-such-shardcache.sock", deadline_s=0.5)


def test_a_deleted_cache_is_unmapped_once_read_so_its_disk_space_comes_back(daemon: Daemon) -> None:
    """Shards stay mapped between a reader's requests; deleting must still drop the maps."""
    from pathlib import Path

    from wire import read_all, records, write_cache

    name = "unmapped-after-delete"
    data = records(20, 50_000)
    with grpc.insecure_channel(daemon.unix_target) as ch:
        write_cache(ch, name, data)
        assert read_all(ch, name) == data
        maps = Path(f"/proc/{daemon.proc.pid}/maps")
        assert f"/{name}/shard-" in maps.read_text(), "an idle shard stays mapped"
        pb_grpc.CacheServiceStub(ch).DeleteCache(pb.DeleteCacheRequest(name=name), timeout=10)
    wait_until(lambda: name not in maps.read_text(), 10, "the deleted cache's files unmapped")
