"""Reading a READY cache: the being-read mark, a shard's chunks, elements by global index.

Every read RPC and every direct read lease (cacheserver/catalog/leases.py) runs
inside :func:`reading`, so eviction and the TTL sweeper skip the cache meanwhile.
Knows nothing of gRPC.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from cacheserver import metrics
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.manifest import CacheRecord
from client.format import lookup
from client.format.blocks import block_elements
from client.format.read_ahead import ReadAheads
from client.wire.chunks import chunk_size
from client.wire.status import InvalidArgument


@contextmanager
def reading(catalog: Catalog, name: str, hit: bool = True) -> Iterator[None]:
    """Mark cache name as being read for the block: eviction and TTL skip it.

    hit counts a hit (a read from a shard's first record) and the block's end
    records the last read time.
    """
    catalog.get_ready(name)  # a cache only in the store: pulled, not under the lock
    catalog.begin_read(name, hit)
    if hit:
        metrics.CACHE_HITS.inc()
    try:
        yield
    finally:
        catalog.retention.end_read(name, time.time())


def read_shard(
    catalog: Catalog,
    name: str,
    shard: int,
    start: int,
    chunk_bytes: int,
    fingerprint: str = "",
    count: int = 0,
    join: Callable[[int, bytes, list[Any]], Any] | None = None,
    aheads: ReadAheads | None = None,
) -> Iterator[tuple[int, bytes, bytes, int]]:
    """Validate the request, then iterate the shard's chunks from start (count records,
    0: to the end): (first element, u32 lengths, data, elements of [start, stop) in it).
    data is the values joined, or what join makes of them; aheads: the requester's
    read-aheads, kept from one of its requests to the next (ReaderPool.read_chunks)."""
    record = catalog.get_ready(name, fingerprint)
    if not 0 <= shard < len(record.shards):
        raise InvalidArgument(
            f"cache {name!r} has {len(record.shards)} shards; shard {shard} does not exist"
        )
    info = record.shards[shard]
    if start > info.num_elements:
        raise InvalidArgument(
            f"start {start} is past the end of shard {shard} ({info.num_elements} elements)"
        )
    if count > info.num_elements - start:
        raise InvalidArgument(
            f"{count} records from {start} run past the end of shard "
            f"{shard} ({info.num_elements} elements)"
        )
    chunk = chunk_size(chunk_bytes)
    stop, k = start + count if count else info.num_elements, block_elements(record.layout_json)

    def chunks() -> Iterator[tuple[int, bytes, bytes, int]]:
        with _shard_files(catalog, record, shard, stop == info.num_elements) as path:
            for first, lengths, data in catalog.shard_readers.read_chunks(
                path, start, stop, chunk, k, join=join, aheads=aheads
            ):
                # whole blocks: the first and last may stick out
                yield (
                    first,
                    lengths,
                    data,
                    min(first + len(lengths) // 4 * k, stop) - max(first, start),
                )

    return chunks()


@contextmanager
def _shard_files(
    catalog: Catalog, record: CacheRecord, shard: int, to_end: bool = False
) -> Iterator[Path]:
    """Where to read shard of record while the block lasts: its directory in the cache, or,
    for a partially resident cache's streamed shard, its copy in the stream window (to_end:
    the block reads the shard to its last element, so the window may drop it first)."""
    resident = catalog.shard_path(record, shard)
    if catalog.tier is None:
        yield resident
        return
    with catalog.tier.shard_files(record.name, shard, resident, to_end) as path:
        yield path


class _Streamed:
    """A ShardGetter of one shard that holds its files only for each get_many: a request
    in any order (ReadElements) never holds more than one streamed shard at once."""

    def __init__(self, catalog: Catalog, record: CacheRecord, shard: int) -> None:
        self._catalog, self._record, self._shard = catalog, record, shard
        k = block_elements(record.layout_json)  # a key per block of k elements
        self._last = -(-record.shards[shard].num_elements // k) - 1

    def get_many(self, keys: bytes, views: bool = False) -> list[Any]:
        # a request in stored order within the shard (a shard-shuffled pass's runs, which
        # jump between shards) that reads its last record has read it to its end
        to_end = bool(np.any(np.frombuffer(keys, ">u8") == self._last))
        with (
            _shard_files(self._catalog, self._record, self._shard, to_end) as path,
            self._catalog.shard_readers.opened(path) as getter,
        ):
            return getter.get_many(keys, False)  # copies: the files may go after this


#: The shards' first elements and the stored bytes of the caches read by index lately, by id
#: (a shuffled pass asks once per chunk: summing every shard each time was quadratic).
_INDEX: dict[int, tuple[CacheRecord, int, np.ndarray, int]] = {}
_INDEX_KEPT = 64


def _index(record: CacheRecord) -> tuple[np.ndarray, int]:
    entry = _INDEX.get(id(record))
    if entry is None or entry[0] is not record or entry[1] != len(record.shards):
        firsts = np.array([s.first_element for s in record.shards], np.uint64)
        stored = sum(s.stored_bytes for s in record.shards)
        if len(_INDEX) >= _INDEX_KEPT:
            _INDEX.clear()
        entry = _INDEX[id(record)] = (record, len(record.shards), firsts, stored)
    return entry[2], entry[3]


def read_elements(
    catalog: Catalog, name: str, fingerprint: str, indices: bytes, chunk_bytes: int
) -> Iterator[tuple[int, bytes, bytes]]:
    """ReadElements: validate the indices against the cache, then yield (position, u32
    lengths, data) chunks in request order. indices: little-endian uint64s, at most
    MAX_INDICES (client/wire/limits.py), as the door that took the request checked."""
    record = catalog.get_ready(name, fingerprint)
    wanted = np.frombuffer(indices, "<u8")
    total = record.num_elements
    if wanted.size and int(wanted.max()) >= total:
        bad = int(wanted[np.argmax(wanted >= total)])
        raise InvalidArgument(
            f"element index {bad} is out of range: cache {name!r} has {total} elements"
        )
    firsts, stored_bytes = _index(record)
    window = lookup.window_records(chunk_bytes, total, stored_bytes)

    def opened(shard: int) -> Any:
        if catalog.tier is not None:
            catalog.tier.fetch_ahead(name, shard)
        if catalog.tier is not None and catalog.tier.ensure(name, [shard]):
            return nullcontext(_Streamed(catalog, record, shard))
        return catalog.shard_readers.opened(catalog.shard_path(record, shard))

    return lookup.gather_chunks(
        opened, wanted, firsts, window, record.layout_json, f"cache {name!r}"
    )
