"""Records by global element index, in any order: ReadElements and direct reads.

Global indices are mapped to (shard, local index) with the shards' first
indices, then served in windows of about one chunk: each window's records are
fetched shard by shard (one short LMDB read transaction per shard and window, so
a slow reader never pins a snapshot) and come out in request order.

Cutting single elements out of blocks (format 2, k elements per value): each
block a request touches is decompressed once, its checksum verified, and each
wanted element is sent as a value of its own: a block of one element (tag
``0x00``, CRC-32, the element byte-shuffled as a one-element block is), which
the client decodes like any block. Knows nothing of gRPC or of the daemon's
catalog.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from client.format.blocks import block_stride, layout_of_json, unpack_block, unshuffle_into
from client.format.codec import RecordError
from client.format.store import ShardGetter
from client.format.values import TAG_RAW, Decompressor, crc32
from client.wire.chunks import chunk_size
from client.wire.status import DataLoss


def window_records(chunk_bytes: int, num_elements: int, stored_bytes: int) -> int:
    """Records per chunk: enough to reach chunk_bytes (two 600 KB images per 1 MiB
    chunk, as ReadShard sends them: half the generator yields of one)."""
    chunk = chunk_size(chunk_bytes)
    return max(1, -(-chunk * num_elements // stored_bytes)) if stored_bytes else 1


def gather_chunks(
    open_shard: Callable[[int], AbstractContextManager[ShardGetter]],
    wanted: np.ndarray,
    firsts: np.ndarray,
    window: int,
    layout_json: str,
    where: str,
    views: bool = False,
) -> Iterator[tuple[int, bytes, Any]]:
    """(position, lengths, data) chunks of the elements at global indices wanted, in
    order, one element per value (blocks: cut out of their blocks).

    open_shard(i) opens shard i for random reads; firsts are the shards' first
    global indices; where names the cache in errors. Shared by ReadElements and
    the client's direct reads. views: data is the list of the chunk's values, each a
    view into the shard's map (valid while the caller holds the shard: the context
    open_shard returned may be closed before they are used, as at most OPEN_SHARDS stay
    open) or a one-element block, and lengths is empty; otherwise they are joined.
    """
    shard_of = np.searchsorted(firsts, wanted, side="right") - 1
    local = wanted - firsts[shard_of]
    extract = Extractor(layout_json)
    span = extract.span(window, wanted.size)
    opened: collections.OrderedDict[int, tuple[AbstractContextManager[ShardGetter], ShardGetter]]
    opened = collections.OrderedDict()  # least recently used first
    try:
        for first in range(0, wanted.size, span):
            stop = min(first + span, wanted.size)
            shards, values = shard_of[first:stop], [b""] * (stop - first)
            found, first_at = np.unique(shards, return_index=True)
            for shard in found[np.argsort(first_at)]:  # in the request's order: a daemon
                # streaming some shards fetches them ahead in that order
                getter = _getter(open_shard, opened, int(shard))
                at = np.flatnonzero(shards == shard)
                got = extract.get(
                    getter, local[first:stop][at], f"{where} shard {int(shard)}", views
                )
                for i, value in zip(at.tolist(), got):
                    values[i] = value
            for start in range(first, stop, window):
                part = values[start - first : min(start + window, stop) - first]
                if views:
                    yield start, b"", part
                    continue
                lengths = struct.pack(f"<{len(part)}I", *map(len, part))
                yield start, lengths, b"".join(part)
    finally:
        while opened:
            opened.popitem()[1][0].__exit__(None, None, None)


#: Shards one request keeps open at most: a shuffled request over a cache of 100,000 small
#: shards touches up to one shard per index, and kept every one open (a file and a map each)
#: until it ended, past the process's file limit. Requests run at once (a reader's batches
#: in flight, several readers) each hold this many: two keep a daemon of 16 such requests
#: under 128 files with its pool's idle shards, and a shard closed here goes back to that
#: pool (ReaderPool.MAX_IDLE), which hands it out again without opening it.
OPEN_SHARDS = 2


def _getter(
    open_shard: Callable[[int], AbstractContextManager[ShardGetter]],
    opened: collections.OrderedDict[int, tuple[AbstractContextManager[ShardGetter], ShardGetter]],
    shard: int,
) -> ShardGetter:
    """Shard's getter, opened unless it is among the OPEN_SHARDS used last (the least
    recently used one closed past them)."""
    if shard in opened:
        opened.move_to_end(shard)
        return opened[shard][1]
    context = open_shard(shard)
    opened[shard] = context, context.__enter__()
    while len(opened) > OPEN_SHARDS:
        opened.popitem(last=False)[1][0].__exit__(None, None, None)
    return opened[shard][1]


#: A ReadElements request on blocks decodes up to this many bytes of elements at once.
SPAN_BYTES = 32 << 20
_GET_BLOCKS = 256


class Extractor:
    """Cuts elements out of their blocks for one request (not thread-safe)."""

    def __init__(self, layout_json: str) -> None:
        layout = self._layout = layout_of_json(layout_json)
        self.k = layout.block_elements
        self._size = layout.record_size if self.k > 1 else 0
        self._dec = Decompressor() if self.k > 1 else None  # one element per value: none

    def span(self, window: int, wanted: int) -> int:
        """Elements of a request to fetch together (sent in chunks of window): every block
        they touch is decompressed once. Blocks: up to SPAN_BYTES of elements, as a shuffled
        request visits a block several times; one element per value: window. Blocks never
        more than SPAN_BYTES (or one element) at once, however well the cache compressed."""
        if self.k == 1:
            return window
        return max(1, min(wanted, SPAN_BYTES // self._size))

    def get(
        self, getter: ShardGetter, local: np.ndarray, where: str, views: bool = False
    ) -> list[Any]:
        """The elements at shard-local indices local, each as a value of its own (views:
        one element per value as views into the map, see ShardGetter.get_many)."""
        if self.k == 1:
            return getter.get_many(local.astype(">u8").tobytes(), views)
        dec = self._dec
        assert dec is not None
        blocks, inverse = np.unique(local // self.k, return_inverse=True)
        order = np.argsort(inverse, kind="stable")  # positions grouped by block
        bounds = np.searchsorted(inverse[order], np.arange(len(blocks) + 1))
        size, rows = self._size, np.empty((len(local), self._size), np.uint8)
        for group in range(0, len(blocks), _GET_BLOCKS):  # bounded memory: a group at a time
            keys = blocks[group : group + _GET_BLOCKS].astype(">u8").tobytes()
            for b, value in enumerate(getter.get_many(keys, views), group):
                try:
                    body, compressed = unpack_block(dec, value, self.k, size)
                except RecordError as exc:
                    raise DataLoss(
                        f"{where} block {int(blocks[b])} is corrupt: {exc}; delete "
                        "the cache and build it again"
                    ) from exc
                block = np.empty((len(body) // size, size), np.uint8)
                unshuffle_into(body, block, block_stride(self._layout, compressed))
                at = order[bounds[b] : bounds[b + 1]]
                within = local[at] % self.k
                if within.max() >= len(block):
                    raise DataLoss(
                        f"{where} block {int(blocks[b])} holds {len(block)} "
                        f"elements, not element {int(within.max())}; delete the "
                        "cache and build it again"
                    )
                rows[at] = block[within]
        # each row as a one-element raw block: shuffled on its own, unless raw blocks are plain
        out = np.empty((len(local), 5 + size), np.uint8)
        stride = block_stride(self._layout, compressed=False)
        out[:, 5:] = (
            rows.reshape(len(local), -1, stride).transpose(0, 2, 1).reshape(len(local), size)
        )
        out[:, 0] = TAG_RAW
        out[:, 1:5] = (
            np.fromiter((crc32(r) for r in out[:, 5:]), "<u4", len(local))
            .view(np.uint8)
            .reshape(-1, 4)
        )
        return list(out)
