"""Admission of a partially resident cache's shards (cacheserver/catalog/pulls.py), on a real
catalog and capacity in a temp dir: a read of a streamed shard asks for room again (room may
have come back), and that costs the same however many shards the cache has.

The store is never reached: every shard here is refused room, so none is fetched.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from cacheserver.catalog.capacity import Capacity
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.manifest import CacheRecord, ShardInfo
from cacheserver.catalog.pulls import Pull
from cacheserver.catalog.stored import StoredCache
from cacheserver.tier.bucket import Bucket, StoredObject

SHARDS = 50_000
SIZE = 1 << 20


def _pull(tmp_path: Path, max_bytes: int) -> Pull:
    """A pull of a stored cache of SHARDS shards of SIZE bytes into a daemon of max_bytes."""
    catalog = Catalog(tmp_path, Capacity(tmp_path, max_bytes=max_bytes))
    record = CacheRecord(
        "big",
        "version:big",
        "{}",
        b"",
        "READY",
        0.0,
        shards=[ShardInfo(i, i, 1, SIZE, SIZE) for i in range(SHARDS)],
    )
    objects = [StoredObject(f"big/objects/u/shard-{i:05d}", SIZE, "0" * 64) for i in range(SHARDS)]
    directory = tmp_path / "caches" / "big"
    directory.mkdir()
    return Pull(
        StoredCache(record, objects),
        directory,
        Bucket("s3://unreached/tier", "http://127.0.0.1:9"),
        catalog.capacity,
        finished=lambda pull: None,
    )


def test_a_streamed_read_asks_for_room_without_memory_in_proportion_to_the_shards(
    tmp_path: Path,
) -> None:
    """Room for three shards: the window's (three slots), so no shard is admitted; each read
    of one asks again. Asking must not walk (or copy, or sort) the cache's 50,000 shards."""
    pull = _pull(tmp_path, 3 * SIZE)
    assert not pull.fetch(0, wait=True)  # streamed: no room beside the window's
    assert pull.partial and pull.resident() == (0, 0)
    tracemalloc.start()
    try:
        for shard in range(1, 21):
            assert not pull.fetch(shard, wait=True)
            assert pull.resident() == (0, 0) and pull.settled()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a list of the shards' sizes alone would be 400 KB
    assert peak < 64 << 10, f"{peak:,} bytes allocated at once while asking for room"
    assert pull.state[:21] == ["streamed"] * 21
