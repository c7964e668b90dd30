"""Block packing: k consecutive elements per stored value (format 2, docs/blocks.md).

A cache whose leaves are all fixed-shape numbers stores ``block_elements`` (k)
consecutive elements per LMDB value: the k record bodies back to back, wrapped
once (one zstd frame or one CRC-32 for the whole block). k is chosen when
writing starts, from the record size, for blocks of about
:data:`BLOCK_TARGET_BYTES` of raw bytes; a record at least that large gets
k = 1, which is exactly format 1 (one element per value). Every block holds k
elements except the last block of each shard.

On ~1 KB records this removes LMDB's per-value overhead (~25% of the file) and
one compression call, one LMDB put/get and one Python loop iteration per
element on both sides; zstd also compresses 64 KiB far better than 1 KB.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from client.codec import (
    Compressor,
    Decompressor,
    Layout,
    RecordError,
    decode_batch,
    decode_fixed,
    encode_batch,
    encode_fixed_batch,
)

#: Raw bytes per block aimed at (docs/blocks.md measures 16, 64 and 256 KiB).
BLOCK_TARGET_BYTES = int(os.environ.get("SHARDCACHE_BLOCK_BYTES", 64 << 10))


def blocked(layout: Layout, target: int = BLOCK_TARGET_BYTES) -> Layout:
    """layout with block_elements chosen for blocks of about target raw bytes.

    Only fixed-numeric layouts are packed (their elements are found in a block
    by arithmetic, no length table); any other layout keeps one element per value.
    """
    if not layout.fixed_numeric or layout.record_size == 0:
        return Layout(layout.leaves, 1)
    return Layout(layout.leaves, max(1, target // layout.record_size))


class BlockPacker:
    """Turns decoded batches into stored values, k elements per value (one per thread).

    add() returns the values of the blocks it completed; the elements of a
    partial block wait for the next add() or for flush(), which writes the last,
    short block. Each call returns (values, raw bytes, elements in the values).
    """

    def __init__(self, layout: Layout, compressor: Compressor | None = None) -> None:
        self.layout = layout
        self._k = layout.block_elements
        self._compressor = compressor or Compressor()
        self._pending = np.empty((0, layout.record_size if layout.fixed_numeric else 0),
                                 np.uint8)

    def add(self, batch: Sequence[Any], n: int) -> tuple[list[bytes], int, int]:
        if self._k == 1:
            bodies = encode_batch(self.layout, batch, n)
            raw = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in bodies)
            return [self._compressor.pack(b) for b in bodies], raw, n
        rows = encode_fixed_batch(self.layout, batch)
        if len(self._pending):
            rows = np.concatenate([self._pending, rows])
        full = len(rows) // self._k * self._k
        self._pending = rows[full:].copy()
        return self._pack(rows[:full])

    def flush(self) -> tuple[list[bytes], int, int]:
        """The last, partial block (no values when there is none)."""
        rows, self._pending = self._pending, self._pending[:0]
        return self._pack(rows)

    def _pack(self, rows: np.ndarray) -> tuple[list[bytes], int, int]:
        k, pack = self._k, self._compressor.pack
        values = [pack(np.ascontiguousarray(rows[i:i + k]).data.cast("B"))
                  for i in range(0, len(rows), k)]
        return values, rows.nbytes, len(rows)


def decode_values(layout: Layout, dec: Decompressor, values: Sequence[Any]
                  ) -> tuple[int, list[Any]]:
    """Decode stored values, each a block or a single element: (elements, batch per leaf).

    Raises RecordError with ``elements_before`` set: how many elements the
    values before the bad one held, to name the bad block.
    """
    bodies: list[Any] = []
    before = 0
    rs = layout.record_size if layout.fixed_numeric else 0
    try:
        for value in values:
            body = dec.unpack(value)
            bodies.append(body)
            if rs:
                if len(body) % rs:
                    raise RecordError(f"block of {len(body)} bytes is not a whole number "
                                      f"of {rs}-byte records")
                before += len(body) // rs
            else:
                before += 1
    except RecordError as exc:
        exc.elements_before = before  # type: ignore[attr-defined]
        raise
    if layout.block_elements == 1:
        return len(bodies), decode_batch(layout, bodies)
    return before, decode_fixed(layout, b"".join(bodies), before)
