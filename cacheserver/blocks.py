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

import numpy as np

from cacheserver.errors import DataLoss
from cacheserver.store import ShardGetter
from client.blocks import unpack_block, unshuffle_into
from client.codec import RecordError
from client.layout import Layout
from client.values import TAG_RAW, Decompressor, crc32


@functools.lru_cache(maxsize=256)
def _layout(layout_json: str) -> Layout:
    return Layout.from_json(layout_json)


def block_geometry(layout_json: str) -> tuple[int, int]:
    """(k, record size) of a cache's layout: k = 1 (and size 0) for format 1 layouts, any
    layout that is not fixed, and one that is not ours to judge here (a reader of the
    layout reports it)."""
    try:
        layout = _layout(layout_json)
    except ValueError:
        return 1, 0
    k = layout.block_elements
    return k, layout.record_size if k > 1 else 0


def block_elements(layout_json: str) -> int:
    """k of a cache's layout (see block_geometry)."""
    return block_geometry(layout_json)[0]


#: A ReadElements request on blocks decodes up to this many bytes of elements at once.
SPAN_BYTES = 32 << 20
_GET_BLOCKS = 256


class Extractor:
    """Cuts elements out of their blocks for one request (not thread-safe)."""

    def __init__(self, layout_json: str) -> None:
        layout = _layout(layout_json)
        self.k = layout.block_elements
        self._stride = layout.block_shuffle
        self._size = layout.record_size if self.k > 1 else 0
        self._dec = Decompressor()

    def span(self, window: int, wanted: int) -> int:
        """Elements of a request to fetch together (sent in chunks of window): every block
        they touch is decompressed once. Blocks: up to SPAN_BYTES of elements, as a shuffled
        request visits a block several times; one element per value: window."""
        if self.k == 1:
            return window
        return max(window, min(wanted, SPAN_BYTES // self._size))

    def get(self, getter: ShardGetter, local: np.ndarray, where: str) -> list[bytes]:
        """The elements at shard-local indices local, each as a value of its own."""
        if self.k == 1:
            return getter.get_many(local.astype(">u8").tobytes())
        blocks, inverse = np.unique(local // self.k, return_inverse=True)
        order = np.argsort(inverse, kind="stable")  # positions grouped by block
        bounds = np.searchsorted(inverse[order], np.arange(len(blocks) + 1))
        size, rows = self._size, np.empty((len(local), self._size), np.uint8)
        for group in range(0, len(blocks), _GET_BLOCKS):  # bounded memory: a group at a time
            keys = blocks[group:group + _GET_BLOCKS].astype(">u8").tobytes()
            for b, value in enumerate(getter.get_many(keys), group):
                try:
                    body = unpack_block(self._dec, value, self.k, size)
                except RecordError as exc:
                    raise DataLoss(f"{where} block {int(blocks[b])} is corrupt: {exc}; delete "
                                   "the cache and build it again") from exc
                block = np.empty((len(body) // size, size), np.uint8)
                unshuffle_into(body, block, self._stride)
                at = order[bounds[b]:bounds[b + 1]]
                within = local[at] % self.k
                if within.max() >= len(block):
                    raise DataLoss(f"{where} block {int(blocks[b])} holds {len(block)} "
                                   f"elements, not element {int(within.max())}; delete the "
                                   "cache and build it again")
                rows[at] = block[within]
        # each row as a one-element block: shuffled on its own
        out = np.empty((len(local), 5 + size), np.uint8)
        out[:, 5:] = rows.reshape(len(local), -1, self._stride).transpose(0, 2, 1).reshape(
            len(local), size)
        out[:, 0] = TAG_RAW
        out[:, 1:5] = np.fromiter((crc32(r) for r in out[:, 5:]), "<u4",
                                  len(local)).view(np.uint8).reshape(-1, 4)
        return list(out)
