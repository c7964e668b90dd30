"""Decoder: a fetched chunk of records into a decoded batch, corrupt records named by place."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from client._transport import pb
from client.errors import DataLossError
from client.format.blocks import (
    block_stride,
    decode_values,
    undelta_rows,
    unpack_block,
    unshuffle_into,
)
from client.format.codec import Empty, RecordError
from client.format.fixed_decode import aligned_empty, decode_into, handles
from client.format.layout import Layout
from client.format.values import Decompressor, raw_in_place, split_chunk
from client.read.fetching.fetch import Chunk, Indices, Landed


class Decoder:
    """Decodes chunks of one cache; thread-safe (one Decompressor per thread). empty makes
    the arrays of fixed-shape leaves (assembly/buffers.py's Buffers.empty for a pass)."""

    def __init__(self, cache: pb.Cache, layout: Layout, empty: Empty = aligned_empty) -> None:
        self._name = cache.name
        self._firsts = np.array([s.first_element for s in cache.shards], np.int64)
        # blocks as the cache has them (a format 1 cache has none), whatever the caller's
        stored = Layout.from_json(cache.layout_json)
        self._layout = dataclasses.replace(stored, leaves=layout.leaves)
        #: the layout chunks are decoded by: the cache's blocks, the caller's leaves
        self.layout = self._layout
        self._into = handles(self._layout)
        self._empty = empty
        self._local = threading.local()

    def _where(self, index: int) -> str:
        shard = int(np.searchsorted(self._firsts, index, side="right")) - 1
        local, k = index - int(self._firsts[shard]), self._layout.block_elements
        if k > 1:
            return (
                f"shard {shard} block {local // k} (elements {local - local % k}-"
                f"{local - local % k + k - 1} of the shard, element {index})"
            )
        return f"shard {shard} record {local} (element {index})"

    def _dec(self) -> Decompressor:
        dec = getattr(self._local, "dec", None)
        if dec is None:
            dec = self._local.dec = Decompressor()
        return dec

    def landed(self, indices: Indices, position: int, landed: Landed) -> int:
        """Check a chunk received straight into its batch's rows (fetch.Landed), at
        position of indices, where it lies: each raw value's CRC-32 over its rows (the one
        pass over its bytes after the socket's copy); a value of another kind (a zstd
        frame as long as a raw value) is unpacked and its body written over its rows.
        Then the row delta of image-like leaves is undone in place. Returns its elements."""
        dec = self._dec()
        for i, (head, body) in enumerate(zip(landed.heads, landed.bodies)):
            try:
                if not raw_in_place(head, body):
                    self._unpack_over(dec, b"".join((head, *body)), body)
            except RecordError as exc:
                at = position + i * landed.per
                raise self._loss(self._where(int(indices[at])), exc) from exc
        if self._layout.row_delta:
            undelta_rows(self._layout, landed.rows)
        return len(landed.rows[0])

    def _unpack_over(self, dec: Decompressor, value: bytes, body: list[memoryview]) -> None:
        """A landed value that is a zstd frame: its body unpacked (and unshuffled, in a
        cache of blocks) over the parts it came in."""
        layout, size = self._layout, sum(len(part) for part in body)
        if layout.block_elements > 1:
            packed, compressed = unpack_block(dec, value, layout.block_elements, layout.record_size)
            plain = np.empty((len(packed) // layout.record_size, layout.record_size), np.uint8)
            unshuffle_into(packed, plain, block_stride(layout, compressed))
            whole = plain.reshape(-1).data
        else:
            whole = memoryview(dec.unpack(value))
        if len(whole) != size:
            raise RecordError(f"value holds {len(whole)} bytes, its elements take {size}")
        at = 0
        for part in body:
            part[:] = whole[at : at + len(part)]
            at += len(part)

    def _loss(self, where: str, exc: RecordError) -> DataLossError:
        return DataLossError(
            f"cache {self._name!r} {where} is corrupt: {exc}; delete the cache and build it again"
        )

    def __call__(
        self, indices: Indices, chunk: Chunk, empty: Empty | None = None
    ) -> tuple[int, list[Any]]:
        """Decode chunk, keeping only its elements at positions [0, len(indices)); empty:
        this chunk's arrays (the decoder's own by default)."""
        dec = self._dec()
        position, lengths, data = chunk
        values: list[memoryview] = []
        try:
            values = data if isinstance(data, list) else split_chunk(lengths, data)
            if self._into:  # only the request's rows are copied out of the chunk's blocks
                return decode_into(
                    self._layout,
                    dec,
                    values,
                    empty or self._empty,
                    max(0, -position),
                    len(indices) - position,
                )
            n, batch = decode_values(self._layout, dec, values, empty or self._empty)
        except RecordError as exc:
            before = getattr(exc, "elements_before", None)
            if not values:
                where = f"chunk at position {position}"
            elif before is None:
                where = f"elements at positions {position}-{position + len(values) - 1}"
            elif position >= 0:
                where = self._where(int(indices[min(position + before, len(indices) - 1)]))
            else:
                where = self._where(int(indices[0]) + position + before)
            raise self._loss(where, exc) from exc
        lo, hi = max(0, -position), min(n, len(indices) - position)
        if lo or hi < n:  # a ReadShard chunk of whole blocks: trim to the request
            batch = [column[lo:hi] for column in batch]
        return hi - lo, batch
