"""Metrics scraped over HTTP, JSON request logs, health draining on SIGTERM."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator

import grpc
import pytest
from daemon import Daemon, free_port
from exposition import scrape
from grpc_health.v1 import health_pb2, health_pb2_grpc
from wire import read_all, records, stub, write_cache

from client.wire.v1 import cache_service_pb2 as pb


@pytest.fixture
def observed() -> Iterator[Daemon]:
    port = free_port()
    d = Daemon(extra_args=("--metrics-listen", f"127.0.0.1:{port}", "--log-format", "json"))
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    yield d.start()
    d.close()


def test_metrics_move_with_reads_writes_errors_and_disk_use(observed: Daemon) -> None:
    url = observed.metrics_url  # type: ignore[attr-defined]
    before = scrape(url)
    assert before[("shardcache_read_bytes_total", (("plane", "grpc"),))] == 0
    assert before[("shardcache_read_bytes_total", (("plane", "data"),))] == 0
    assert before[("shardcache_disk_bytes", ())] == 0
    data = records(10, 10_000)
    with grpc.insecure_channel(observed.unix_target) as ch:
        write_cache(ch, "m", data)
        assert read_all(ch, "m") == data
        with pytest.raises(grpc.RpcError):
            stub(ch).GetCache(pb.GetCacheRequest(name="absent"), timeout=5)
        disk = stub(ch).GetCache(pb.GetCacheRequest(name="m"), timeout=5).cache.disk_bytes
    after = scrape(url)
    assert after[("shardcache_read_bytes_total", (("plane", "grpc"),))] == 100_000
    assert after[("shardcache_read_elements_total", ())] == 10
    assert after[("shardcache_written_bytes_total", ())] == 100_000
    assert after[("shardcache_written_elements_total", ())] == 10
    assert after[("shardcache_cache_misses_total", ())] == 1
    assert after[("shardcache_cache_hits_total", ())] == 1
    assert after[("shardcache_disk_bytes", ())] == disk > 0
    assert (
        after[("shardcache_rpc_errors_total", (("code", "NOT_FOUND"), ("method", "GetCache")))] == 1
    )
    assert after[("shardcache_active_streams", (("kind", "read"),))] == 0
    assert after[("shardcache_evictions_total", (("reason", "capacity"),))] == 0
    assert not any("shard" in dict(labels) for _, labels in after), "no per-shard labels"


def test_elements_read_count_elements_not_the_blocks_that_carry_them(observed: Daemon) -> None:
    tf = pytest.importorskip("tensorflow")
    from client import CacheClient

    url = observed.metrics_url  # type: ignore[attr-defined]
    with CacheClient(observed.unix_target) as cc:
        assert len(list(cc.cache(tf.data.Dataset.range(1000), name="b"))) == 1000
        assert '"block_elements":32768' in cc._get("b").layout_json  # all in one block
        before = scrape(url)[("shardcache_read_elements_total", ())]
        for start, want in [(0, 1000), (600, 400)]:
            assert len(list(cc.dataset("b", start=start, direct=False))) == want
            after = scrape(url)[("shardcache_read_elements_total", ())]
            assert after - before == want
            before = after


def test_every_request_outcome_is_one_json_log_line(observed: Daemon) -> None:
    data = records(3, 1000)
    with grpc.insecure_channel(observed.unix_target) as ch:
        write_cache(ch, "logged", data)
        read_all(ch, "logged")
        with pytest.raises(grpc.RpcError):
            stub(ch).DeleteCache(pb.DeleteCacheRequest(name="../etc"), timeout=5)
    lines = [json.loads(line) for line in observed.log().splitlines() if line.startswith("{")]
    requests = [r for r in lines if r["logger"] == "cacheserver.requests"]
    by_method = {r["method"]: r for r in requests}
    assert by_method["WriteCache"]["cache"] == "logged"
    assert by_method["WriteCache"]["bytes"] == 3000 and by_method["WriteCache"]["code"] == "OK"
    assert by_method["ReadShard"]["bytes"] == 3000
    assert by_method["DeleteCache"]["code"] == "INVALID_ARGUMENT"
    assert all(r["duration_seconds"] >= 0 for r in requests)


def test_sigterm_turns_health_not_serving_while_still_serving_then_drains_and_exits(
    tmp_path,
) -> None:
    daemon = Daemon(extra_args=("--shutdown-delay", "3", "--grace", "5")).start()
    try:
        channel = grpc.insecure_channel(daemon.unix_target)
        statuses: queue.Queue[int] = queue.Queue()
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="cacheserver.v1.CacheService")
        )

        def follow() -> None:
            try:
                for reply in watch:
                    statuses.put(reply.status)
            except grpc.RpcError:
                statuses.put(-1)

        follower = threading.Thread(target=follow)
        follower.start()
        assert statuses.get(timeout=30) == health_pb2.HealthCheckResponse.SERVING
        code: dict[str, int] = {}
        waiter = threading.Thread(target=lambda: code.setdefault("rc", daemon.terminate()))
        waiter.start()
        assert statuses.get(timeout=30) == health_pb2.HealthCheckResponse.NOT_SERVING
        # NOT_SERVING comes first: calls in the delay still succeed
        stub(channel).ListCaches(pb.ListCachesRequest(), timeout=5)
        watch.cancel()
        waiter.join(60)
        follower.join(60)
        assert code["rc"] == 0
        assert "health is NOT_SERVING; still serving" in daemon.log()
        channel.close()
    finally:
        daemon.close()
