"""Capacity: LRU eviction, pins, refusals that name the numbers, TTL, readers protected."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from daemon import Daemon
from waits import wait_until
from wire import names, read_all, reason, records, split, stub, write_cache

from client import CacheClient, CacheNotFoundError
from client.wire.v1 import cache_service_pb2 as pb

MIB = 1 << 20


def one_mib(seed: int) -> list[bytes]:
    return records(8, 128 << 10, seed)  # 1 MiB of incompressible records


@pytest.fixture
def limited() -> Iterator[Daemon]:
    # 1 MiB caches take ~1.07 MiB on disk (LMDB pages and manifests): three fit, four do not
    d = Daemon(extra_args=("--max-bytes", "3.6MiB", "--ttl-sweep-interval", "0.1")).start()
    yield d
    d.close()


def test_eviction_takes_the_least_recently_read_unpinned_cache_first(limited: Daemon) -> None:
    with grpc.insecure_channel(limited.unix_target) as ch, CacheClient(limited.unix_target) as cc:
        data = {n: one_mib(i) for i, n in enumerate("abcdef")}
        for n in "abc":
            write_cache(ch, n, data[n])
        assert read_all(ch, "a") == data["a"]  # a is now the most recently read
        write_cache(ch, "d", data["d"])
        assert names(ch) == ["a", "c", "d"], "b was the least recently used"
        cc.pin("c")
        write_cache(ch, "e", data["e"])
        assert names(ch) == ["c", "d", "e"], "c is pinned, so a (read before d) went next"
        assert cc.info("c").pinned and not cc.info("d").pinned
        assert read_all(ch, "c") == data["c"]
        assert cc.info("c").hits == 1 and cc.info("c").last_read_time > 0
        assert "evicted cache 'a' (capacity)" in limited.log()


def test_a_write_that_cannot_fit_is_refused_with_the_numbers_and_its_space_released(
    limited: Daemon,
) -> None:
    with grpc.insecure_channel(limited.unix_target) as ch, CacheClient(limited.unix_target) as cc:
        data = {n: one_mib(i) for i, n in enumerate("xy")}
        for n in "xy":
            write_cache(ch, n, data[n])
            cc.pin(n)
        caches_dir = limited.data_dir / "caches"
        with pytest.raises(grpc.RpcError) as err:
            write_cache(ch, "huge", records(24, 128 << 10, 9))  # 3 MiB: cannot fit beside x, y
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason(err.value) == "CAPACITY_EXCEEDED"
        message = err.value.details()
        assert "no room for cache 'huge'" in message
        assert "--max-bytes is 3,774,873 bytes" in message
        assert "caches use" in message and "2 pinned" in message, message
        assert names(ch) == ["x", "y"]
        assert sorted(p.name for p in caches_dir.iterdir()) == ["x", "y"], "space not released"
        assert read_all(ch, "x") == data["x"] and read_all(ch, "y") == data["y"]
        cc.unpin("x")
        write_cache(ch, "fits", records(16, 128 << 10, 5))  # 2 MiB: evicts the unpinned x
        assert names(ch) == ["fits", "y"]


def test_a_cache_being_read_is_not_evicted_and_its_reader_gets_every_record(
    limited: Daemon,
) -> None:
    with grpc.insecure_channel(limited.unix_target) as ch:
        data = {n: one_mib(i) for i, n in enumerate("pqrs")}
        for n in "pqr":
            write_cache(ch, n, data[n])
        stream = stub(ch).ReadShard(
            pb.ReadShardRequest(name="p", shard=0, chunk_bytes=4096), timeout=60
        )
        first = next(stream)  # p, the least recently used, is now being read
        write_cache(ch, "s", data["s"])
        assert names(ch) == ["p", "r", "s"], "q was evicted instead of p"
        got = split(first) + [rec for chunk in stream for rec in split(chunk)]
        assert got == data["p"]


def test_a_cache_idle_past_its_ttl_is_deleted_unless_pinned(limited: Daemon) -> None:
    with grpc.insecure_channel(limited.unix_target) as ch, CacheClient(limited.unix_target) as cc:
        write_cache(ch, "short", one_mib(1))
        write_cache(ch, "kept", one_mib(2))
        cc.pin("kept")
        assert cc.set_ttl("kept", 0.2).ttl_seconds == pytest.approx(0.2)
        cc.set_ttl("short", 0.2)

        def short_gone() -> bool:
            try:
                cc.info("short")
            except CacheNotFoundError:
                return True
            return False

        wait_until(short_gone)
        # the sweep that removed "short" saw "kept" expired too, and spared it: pinned
        assert cc.info("kept").pinned and names(ch) == ["kept"]
        # the sweep logs after it deletes: under load the line may land a moment later
        wait_until(lambda: "evicted cache 'short' (ttl)" in limited.log())
        cc.set_ttl("kept", None)
        assert cc.info("kept").ttl_seconds == 0
