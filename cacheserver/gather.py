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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import numpy as np

from cacheserver.blocks import Extractor
from cacheserver.catalog import DEFAULT_CHUNK_BYTES, Catalog
from cacheserver.errors import InvalidArgument
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
    window = window_records(chunk_bytes, total, sum(s.stored_bytes for s in record.shards))
    firsts = np.array([s.first_element for s in record.shards], np.uint64)
    return gather_chunks(lambda shard: catalog.readers.opened(catalog.shard_path(record, shard)),
                         wanted, firsts, window, record.layout_json, f"cache {name!r}")


def window_records(chunk_bytes: int, num_elements: int, stored_bytes: int) -> int:
    """Records per chunk: enough to reach chunk_bytes (two 600 KB images per 1 MiB
    chunk, as ReadShard sends them: half the generator yields of one)."""
    chunk = min(max(chunk_bytes or DEFAULT_CHUNK_BYTES, 4096), 16 << 20)
    return max(1, -(-chunk * num_elements // stored_bytes)) if stored_bytes else 1


def gather_chunks(open_shard: Callable[[int], AbstractContextManager[ShardGetter]],
                  wanted: np.ndarray, firsts: np.ndarray, window: int, layout_json: str,
                  where: str) -> Iterator[tuple[int, bytes, bytes]]:
    """(position, lengths, data) chunks of the elements at global indices wanted, in
    order, one element per value (blocks: cut out of their blocks).

    open_shard(i) opens shard i for random reads; firsts are the shards' first
    global indices; where names the cache in errors. Shared by ReadElements and
    the client's direct reads.
    """
    shard_of = np.searchsorted(firsts, wanted, side="right") - 1
    local = wanted - firsts[shard_of]
    extract = Extractor(layout_json)
    span = extract.span(window, wanted.size)
    with contextlib.ExitStack() as stack:
        open_shards: dict[int, ShardGetter] = {}
        for first in range(0, wanted.size, span):
            stop = min(first + span, wanted.size)
            shards, values = shard_of[first:stop], [b""] * (stop - first)
            for shard in np.unique(shards):
                getter = open_shards.get(int(shard))
                if getter is None:
                    getter = open_shards[int(shard)] = stack.enter_context(
                        open_shard(int(shard)))
                at = np.flatnonzero(shards == shard)
                got = extract.get(getter, local[first:stop][at], f"{where} shard {int(shard)}")
                for i, value in zip(at.tolist(), got):
                    values[i] = value
            for start in range(first, stop, window):
                part = values[start - first:min(start + window, stop) - first]
                lengths = struct.pack(f"<{len(part)}I", *map(len, part))
                yield start, lengths, b"".join(part)
