"""Reads records by global element index, in any order: the ReadElements RPC.

A request names up to :data:`MAX_INDICES` global indices. They are mapped to
(shard, local index) with the manifest's shard boundaries, then served in
windows of about one chunk: each window's records are fetched shard by shard
(one short LMDB read transaction per shard and window, so a slow reader never
pins a snapshot) and sent in request order. Knows nothing of gRPC.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import numpy as np

from cacheserver.blocks import Extractor
from cacheserver.catalog import DEFAULT_CHUNK_BYTES, Catalog
from cacheserver.errors import InvalidArgument
from cacheserver.records import CacheRecord
from cacheserver.store import ShardGetter

MAX_INDICES = 65536


def read_elements(catalog: Catalog, name: str, fingerprint: str, indices: bytes,
                  chunk_bytes: int) -> Iterator[tuple[int, bytes, bytes]]:
    """Validate the request, then yield (position, u32 lengths, data) chunks in order."""
    record = catalog.get_ready(name, fingerprint)
    if len(indices) % 8:
        raise InvalidArgument(f"indices is {len(indices)} bytes, not a whole number of "
                              "little-endian uint64s")
    wanted = np.frombuffer(indices, "<u8")
    if wanted.size > MAX_INDICES:
        raise InvalidArgument(f"{wanted.size} indices in one ReadElements request; the limit "
                              f"is {MAX_INDICES}: split the request")
    total = record.num_elements
    if wanted.size and int(wanted.max()) >= total:
        bad = int(wanted[np.argmax(wanted >= total)])
        raise InvalidArgument(f"element index {bad} is out of range: cache {name!r} has "
                              f"{total} elements")
    chunk = min(max(chunk_bytes or DEFAULT_CHUNK_BYTES, 4096), 16 << 20)
    stored = sum(s.stored_bytes for s in record.shards)
    # records per window: enough to reach chunk bytes (two 600 KB images per
    # 1 MiB chunk, as ReadShard sends them: half the generator yields of one)
    window = max(1, -(-chunk * total // stored)) if stored else 1
    firsts = np.array([s.first_element for s in record.shards], np.uint64)
    return _chunks(catalog, record, wanted, firsts, window)


def _chunks(catalog: Catalog, record: CacheRecord, wanted: np.ndarray, firsts: np.ndarray,
            window: int) -> Iterator[tuple[int, bytes, bytes]]:
    shard_of = np.searchsorted(firsts, wanted, side="right") - 1
    local = wanted - firsts[shard_of]
    extract = Extractor(record.layout_json)  # blocks: elements cut out of their blocks
    span = extract.span(window, wanted.size)
    with contextlib.ExitStack() as stack:
        open_shards: dict[int, ShardGetter] = {}
        for first in range(0, wanted.size, span):
            stop = min(first + span, wanted.size)
            values = _fetch(catalog, record, stack, open_shards, extract,
                            shard_of[first:stop], local[first:stop])
            for start in range(first, stop, window):
                part = values[start - first:min(start + window, stop) - first]
                lengths = struct.pack(f"<{len(part)}I", *map(len, part))
                yield start, lengths, b"".join(part)


def _fetch(catalog: Catalog, record: CacheRecord, stack: contextlib.ExitStack,
           open_shards: dict[int, ShardGetter], extract: Extractor, shards: np.ndarray,
           local: np.ndarray) -> list[bytes]:
    """The values of the elements at (shard, shard-local index) pairs, in that order."""
    values: list[bytes] = [b""] * len(local)
    for shard in np.unique(shards):
        getter = open_shards.get(int(shard))
        if getter is None:
            path = catalog.shard_path(record, int(shard))
            getter = open_shards[int(shard)] = stack.enter_context(
                catalog.readers.opened(path))
        where = np.flatnonzero(shards == shard)
        got = extract.get(getter, local[where],
                          f"cache {record.name!r} shard {int(shard)}")
        for i, value in zip(where.tolist(), got):
            values[i] = value
    return values
