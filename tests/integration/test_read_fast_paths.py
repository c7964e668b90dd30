"""The read path's fast paths against a real daemon (docs/design.md).

Large fixed-shape elements (>= 64 KiB) are decoded straight into aligned batch arrays
(client/format/fixed_decode.py), read directly from views into the shard's map (no joined
chunk), and go through from_generator one by one (no unbatch). Each must yield what
the plain gRPC path yields, in every order, and keep the map alive exactly as long as
the pass that reads it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from waits import wait_until

tf = pytest.importorskip("tensorflow")

from sharded import write_sharded  # noqa: E402

from client import CacheClient  # noqa: E402
from client.format.fixed_decode import MIN_RECORD_BYTES  # noqa: E402

N = 200
SIDE = 132  # 132 x 132 float32 = 69,696 bytes: one element per value, the aligned decoder
assert MIN_RECORD_BYTES <= SIDE * SIDE * 4


def source(n: int = N, offset: int = 0) -> tf.data.Dataset:
    """Large elements whose pixels are a function of their index (checkable), a dict."""
    return tf.data.Dataset.range(n).map(
        lambda i: {
            "x": tf.cast(i + offset, tf.float32)
            + tf.reshape(tf.range(SIDE * SIDE, dtype=tf.float32), (SIDE, SIDE)),
            "i": i + offset,
        }
    )


PIXELS = np.arange(SIDE * SIDE, dtype=np.float32).reshape(SIDE, SIDE)


def ids(ds: tf.data.Dataset) -> list[int]:
    out = []
    for element in ds.as_numpy_iterator():
        np.testing.assert_array_equal(element["x"], np.float32(element["i"]) + PIXELS)
        out.append(int(element["i"]))
    return out


def mapped(shards: Path) -> list[str]:
    return [
        line for line in Path("/proc/self/maps").read_text().splitlines() if str(shards) in line
    ]


@pytest.fixture(scope="module")
def large(daemon) -> str:
    with CacheClient(daemon.unix_target) as cc:
        cache = write_sharded(
            cc, source(), "fast-large", shard_bytes=1_000_000, chunk_bytes=300_000
        )
    assert len(cache.shards) > 2
    return cache.name


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
def test_large_elements_read_directly_equal_what_grpc_yields_in_every_order(
    cc, large, shuffle
) -> None:
    def epochs(direct: bool) -> list[list[int]]:
        ds = cc.dataset(large, shuffle=shuffle, seed=9, parallel_shards=2, direct=direct)
        return [ids(ds) for _epoch in range(2)]

    over_grpc = epochs(False)
    direct = epochs(True)
    assert direct == over_grpc
    assert sorted(direct[0]) == list(range(N))


def test_large_elements_keep_the_sources_spec_and_cardinality_batched_or_not(cc, large) -> None:
    ds = cc.dataset(large)
    assert ds.element_spec == source().element_spec
    assert int(ds.cardinality()) == N
    batches = list(ds.batch(64).as_numpy_iterator())
    assert [len(b["i"]) for b in batches] == [64, 64, 64, 8]
    np.testing.assert_array_equal(np.concatenate([b["i"] for b in batches]), np.arange(N))


def test_a_direct_pass_stopped_early_unmaps_its_shards_and_the_next_pass_is_whole(
    daemon, cc, large
) -> None:
    shards = daemon.data_dir / "caches" / large
    it = iter(cc.dataset(large, direct=True, prefetch_bytes=1))
    first = next(it)
    assert int(first["i"]) == 0 and mapped(shards), "the pass does not map the shard files"
    del it  # stops the pass mid-epoch, decoded batches and queued views are dropped
    # the iterator's teardown ends the pass
    wait_until(lambda: not mapped(shards), 30, "a stopped pass's shard files unmapped")
    assert ids(cc.dataset(large, direct=True)) == list(range(N))


def test_a_large_element_cache_deleted_and_rebuilt_mid_pass_keeps_serving_the_leased_files(
    daemon, name
) -> None:
    """The views point into the map of files the cache no longer has: still valid."""
    with CacheClient(daemon.unix_target) as cc:
        write_sharded(cc, source(), name, shard_bytes=1_000_000, chunk_bytes=300_000)
        it = cc.dataset(name, direct=True, prefetch_bytes=1).as_numpy_iterator()
        got = [int(next(it)["i"]) for _ in range(5)]
        cc.delete(name)
        write_sharded(cc, source(offset=10_000), name, shard_bytes=1_000_000, chunk_bytes=300_000)
        for element in it:
            np.testing.assert_array_equal(element["x"], np.float32(element["i"]) + PIXELS)
            got.append(int(element["i"]))
        assert got == list(range(N)), "the pass mixed in the rebuilt cache's elements"
        assert ids(cc.dataset(name, direct=True)) == list(range(10_000, 10_000 + N))


def test_cc_cache_writes_and_reads_large_elements_one_by_one(cc, name) -> None:
    ds = cc.cache(source(), name)
    assert ids(ds) == list(range(N))  # writes the cache, yielding element by element
    assert ids(ds) == list(range(N))  # reads it
    assert (cc.info(name).num_elements, cc.info(name).direct_reads) == (N, 1)
