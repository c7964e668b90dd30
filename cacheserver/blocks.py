"""Blocks on the daemon side: k elements per stored value (format 2, docs/blocks.md).

The daemon never decodes elements; it needs only k (``block_elements`` in the
cache's layout) to map an element to its value, and, for ReadElements (records
by global index, any order), to cut single elements out of their blocks: each
block a request touches is decompressed once, its checksum verified, and each
wanted element is sent as a value of its own: a block of one element (tag
``0x00``, CRC-32, the element byte-shuffled as a one-element block is), which
the client decodes like any block.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from cacheserver.errors import DataLoss
from cacheserver.store import ShardGetter
from client.blocks import unshuffle_into
from client.codec import TAG_RAW, Decompressor, Layout, RecordError


@functools.lru_cache(maxsize=256)
def _layout(layout_json: str) -> Layout:
    return Layout.from_json(layout_json)


def block_elements(layout_json: str) -> int:
    """k of a cache's layout (1 for format 1 layouts and any layout that is not fixed)."""
    try:
        return _layout(layout_json).block_elements
    except ValueError:
        return 1  # not ours to judge here: a reader of the layout reports it


class Extractor:
    """Cuts elements out of their blocks for one request (not thread-safe)."""

    def __init__(self, layout_json: str) -> None:
        layout = _layout(layout_json)
        self.k = layout.block_elements
        self._stride = layout.block_shuffle
        self._size = layout.record_size if self.k > 1 else 0
        self._dec = Decompressor()

    def get(self, getter: ShardGetter, local: np.ndarray, where: str) -> list[bytes]:
        """The elements at shard-local indices local, each as a value of its own."""
        if self.k == 1:
            return getter.get_many(local.astype(">u8").tobytes())
        blocks, inverse = np.unique(local // self.k, return_inverse=True)
        size, bodies = self._size, []
        for block, value in zip(blocks.tolist(),
                                getter.get_many(blocks.astype(">u8").tobytes())):
            try:
                body = self._dec.unpack(value)
                if len(body) % size or len(body) > size * self.k:
                    raise RecordError(f"block of {len(body)} bytes is not a whole number of "
                                      f"at most {self.k} {size}-byte records")
            except RecordError as exc:
                raise DataLoss(f"{where} block {block} is corrupt: {exc}; delete the cache "
                               "and build it again") from exc
            rows = np.empty((len(body) // size, size), np.uint8)
            unshuffle_into(body, rows, self._stride)
            bodies.append(rows)
        rows = np.empty((len(local), size), np.uint8)
        for j, (b, i) in enumerate(zip(inverse.tolist(), (local % self.k).tolist())):
            if i >= len(bodies[b]):
                raise DataLoss(f"{where} block {int(blocks[b])} holds {len(bodies[b])} "
                               f"elements, not element {i}; delete the cache and build it "
                               "again")
            rows[j] = bodies[b][i]
        # each row as a one-element block: shuffled on its own
        out = np.empty((len(local), 5 + size), np.uint8)
        out[:, 5:] = rows.reshape(len(local), -1, self._stride).transpose(0, 2, 1).reshape(
            len(local), size)
        out[:, 0] = TAG_RAW
        out[:, 1:5] = np.fromiter((zlib.crc32(r) for r in out[:, 5:]), "<u4",
                                  len(local)).view(np.uint8).reshape(-1, 4)
        return list(out)
