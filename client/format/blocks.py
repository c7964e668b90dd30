"""Block packing: k consecutive elements per stored value (format 2, docs/format.md, "Blocks").

A cache whose leaves are all fixed-shape numbers stores ``block_elements`` (k)
consecutive elements per LMDB value: the k record bodies back to back, wrapped
once (one zstd frame or one CRC-32 for the whole block). k is chosen when
writing starts, from the record size, for blocks of about
``$SHARDCACHE_BLOCK_BYTES`` of raw bytes (client/settings.py: 256 KiB; docs/format.md,
"Blocks" measures 16, 64 and 256 KiB); a record at least that large, or
over :data:`MAX_BLOCKED_RECORD_BYTES`, gets k = 1, which is exactly format 1
(one element per value). Every block holds k elements except the last block
of each shard.

On ~1 KB records this removes LMDB's per-value overhead (~25% of the file) and
one compression call, one LMDB put/get and one Python loop iteration per
element on both sides; zstd also compresses a 256 KiB block far better than 1 KB.

A block's body is *byte-shuffled* with stride s = ``block_shuffle`` (the
smallest itemsize of the leaves): the block's bytes, seen as an (m, s) array,
are stored transposed, all first bytes of each s-byte word, then all second
bytes, ... (the Blosc/HDF5 shuffle filter). Exponents and high-order bytes of
numbers then sit together and compress: 2 KB int32 token ids 2.1x -> 2.7x with
zstd-1 (docs/format.md, "Blocks"). Only a block kept as a zstd frame is stored
shuffled (format 4, ``plain_raw``): one that does not compress enough is stored
raw with its records as they are, so that reading it is one copy into the batch
(1 KB float32 records: 0.49x -> 0.87x the in-memory cache, docs/design.md).

*Row delta* (format 3, ``row_delta``): every row of an image-like leaf (uint8,
fixed shape, rank >= 2: height x width [x channels]) but the first is stored
as its byte-wise difference from the row above, modulo 256 (PNG's "Up"
filter). Neighbouring rows of a photo are alike, so the differences are small
numbers that zstd compresses where it cannot compress the pixels themselves:
decoded 224x224x3 photo crops 1.00x -> 1.82x with zstd-1 (docs/format.md, "Blocks").
Undoing it is one vectorized add per row, across the whole batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from client import settings
from client.errors import InvalidArgumentError
from client.format.codec import (
    Empty,
    RecordError,
    decode_batch,
    decode_fixed,
    encode_batch,
    encode_fixed_batch,
    fixed_columns,
)
from client.format.layout import MAX_BLOCK_BYTES, Layout, row_delta_leaf
from client.format.values import Compressor, Decompressor, raw_rows

#: Larger records stay one per value whatever the target: a block of a few of them saves
#: no per-element work worth having and adds the unshuffle and zstd to every read
#: (110 KB float32 records read 1.65x slower in blocks of two, docs/format.md, "Blocks").
MAX_BLOCKED_RECORD_BYTES = 32 << 10


def shuffle(rows: np.ndarray, stride: int) -> np.ndarray:
    """The stored body of the block rows (a C-contiguous uint8 (k, record) array)."""
    if stride == 1:
        return rows
    return np.ascontiguousarray(rows.reshape(-1, stride).T)


def block_stride(layout: Layout, compressed: bool) -> int:
    """The byte-shuffle stride of a stored block's body: the layout's, but 1 for a raw
    block of a plain_raw layout (its records as they are)."""
    return 1 if layout.plain_raw and not compressed else layout.block_shuffle


def unshuffle_into(body: Any, out: np.ndarray, stride: int) -> None:
    """Write the records of a stored block body into out, a C-contiguous uint8 (m, record)."""
    src = np.frombuffer(body, np.uint8)
    if stride == 1:
        out.reshape(-1)[:] = src
    else:
        out.reshape(-1, stride)[:] = src.reshape(stride, -1).T


#: Elements per write batch (write-through and materialization), bounded to about
#: this many bytes. The count bound keeps latency low: nothing is yielded (and
#: Ctrl-C is not seen) until the source has produced a whole batch.
WRITE_BATCH_BYTES = 4 << 20
WRITE_BATCH_ELEMENTS = 256


def write_batch_elements(layout: Layout) -> int:
    """Elements per batch pulled from a source and packed into values at once."""
    record = max(layout.record_size, 1) if layout.fixed_numeric else 64 << 10
    return max(1, min(WRITE_BATCH_ELEMENTS, WRITE_BATCH_BYTES // record))


def check_block_bytes(block_bytes: object) -> int:
    """block_bytes as given to cc.cache() or materialize(): None is the default target."""
    if block_bytes is None:
        return settings.BLOCK_BYTES.get()
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 0:
        raise InvalidArgumentError(
            f"block_bytes must be an int >= 0 (0: one element per "
            f"stored value), got {block_bytes!r}"
        )
    return block_bytes


def delta_rows(layout: Layout, batch: Sequence[Any]) -> list[Any]:
    """batch (one array per leaf) with the rows of its image-like leaves as differences."""
    out = list(batch)
    for i, leaf in enumerate(layout.leaves):
        if row_delta_leaf(leaf):
            rows = np.asarray(batch[i])
            out[i] = rows.copy()
            np.subtract(rows[:, 1:], rows[:, :-1], out=out[i][:, 1:])
    return out


def undelta_rows(layout: Layout, batch: list[Any]) -> list[Any]:
    """Undo delta_rows on a decoded batch, in place where its arrays are writable."""
    for i, leaf in enumerate(layout.leaves):
        if row_delta_leaf(leaf):
            rows = batch[i] if batch[i].flags.writeable else batch[i].copy()
            for r in range(1, rows.shape[1]):  # one add per row, over the whole batch
                np.add(rows[:, r], rows[:, r - 1], out=rows[:, r])
            batch[i] = rows
    return batch


def blocked(layout: Layout, target: int | None = None) -> Layout:
    """layout with block_elements chosen for blocks of about target raw bytes (None:
    $SHARDCACHE_BLOCK_BYTES).

    Only fixed-numeric layouts of records up to MAX_BLOCKED_RECORD_BYTES are
    packed (their elements are found in a block by arithmetic, no length table);
    any other layout keeps one element per value. Fixed-numeric layouts with an
    image-like leaf also get the row delta.
    """
    if not layout.fixed_numeric or layout.record_size == 0:
        return Layout(layout.leaves, 1)
    small = layout.record_size <= MAX_BLOCKED_RECORD_BYTES
    target = settings.BLOCK_BYTES.get() if target is None else target
    k = max(1, min(target, MAX_BLOCK_BYTES) // layout.record_size) if small else 1
    stride = min(leaf.np_dtype.itemsize for leaf in layout.leaves) if k > 1 else 1
    return Layout(
        layout.leaves, k, stride, any(map(row_delta_leaf, layout.leaves)), plain_raw=stride > 1
    )


class BlockPacker:
    """Turns decoded batches into stored values, k elements per value (one per thread).

    add() returns the values of the blocks it completed; the elements of a
    partial block wait for the next add() or for flush(), which writes the last,
    short block. Each call returns (values, raw bytes, elements in the values).
    """

    def __init__(self, layout: Layout, compressor: Compressor | None = None) -> None:
        self.layout = layout
        self._k = layout.block_elements
        # a zstd frame kept only at >= 1.25x, for blocks as for single values
        self._compressor = compressor or Compressor()
        self._pending = np.empty((0, layout.record_size if layout.fixed_numeric else 0), np.uint8)

    def add(
        self, batch: Sequence[Any], n: int, compress: bool = True
    ) -> tuple[list[bytes], int, int]:
        """compress=False: the completed values are stored raw, without trying zstd."""
        if self.layout.row_delta:
            batch = delta_rows(self.layout, batch)
        if self._k == 1 and self.layout.fixed_numeric:  # each value joined from its leaves
            cols = fixed_columns(self.layout, batch)
            pack = self._compressor.pack_parts
            return (
                [pack([c[i] for c in cols], compress) for i in range(n)],
                n * self.layout.record_size,
                n,
            )
        if self._k == 1:
            bodies = encode_batch(self.layout, batch, n)
            raw = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in bodies)
            return [self._compressor.pack(b, compress) for b in bodies], raw, n
        rows = encode_fixed_batch(self.layout, batch)
        if len(self._pending):
            rows = np.concatenate([self._pending, rows])
        full = len(rows) // self._k * self._k
        self._pending = rows[full:].copy()
        return self._pack(rows[:full], compress)

    def flush(self, compress: bool = True) -> tuple[list[bytes], int, int]:
        """The last, partial block (no values when there is none)."""
        rows, self._pending = self._pending, self._pending[:0]
        return self._pack(rows, compress)

    def _pack(self, rows: np.ndarray, compress: bool) -> tuple[list[bytes], int, int]:
        k, comp, stride = self._k, self._compressor, self.layout.block_shuffle
        values = []
        for i in range(0, len(rows), k):
            block = np.ascontiguousarray(rows[i : i + k])
            if not self.layout.plain_raw:  # format 2 and 3: raw blocks are shuffled too
                values.append(comp.pack(shuffle(block, stride).data.cast("B"), compress))
                continue
            frame = None
            if compress and comp.worth_trying():
                frame = comp.compressed(shuffle(block, stride).data.cast("B"))
            values.append(frame or comp.raw((block.data.cast("B"),)))
        return values, rows.nbytes, len(rows)


def unpack_block(dec: Decompressor, value: Any, k: int, record_size: int) -> tuple[Any, bool]:
    """A stored block's body, checked to hold a whole number of at most k records, and
    True when it was a zstd frame (block_stride says how it is shuffled)."""
    body, compressed = dec.unpack_tagged(value)
    if len(body) % record_size or len(body) > record_size * k:
        raise RecordError(
            f"block of {len(body)} bytes is not a whole number "
            f"of at most {k} {record_size}-byte records"
        )
    return body, compressed


def unpack_values(
    layout: Layout, dec: Decompressor, values: Sequence[Any], exact_records: bool = False
) -> tuple[list[Any], list[int], int]:
    """The bodies of stored values, each a block or a single element, their shuffle
    strides (block_stride; 1 for single elements) and the elements they hold.
    exact_records: a single element's body must be layout.record_size long.

    Raises RecordError with ``elements_before`` set: how many elements the
    values before the bad one held, to name the bad block.
    """
    k = layout.block_elements
    rs = layout.record_size if k > 1 or exact_records else 0  # variable layouts have none
    bodies: list[Any] = []
    strides: list[int] = []
    before = 0
    try:
        for value in values:
            if k == 1:
                body = dec.unpack(value)
                if exact_records and len(body) != rs:
                    raise RecordError(f"record has {len(body)} bytes, layout says {rs}")
                strides.append(1)
            else:
                body, compressed = unpack_block(dec, value, k, rs)
                strides.append(block_stride(layout, compressed))
            bodies.append(body)
            before += 1 if k == 1 else len(body) // rs
    except RecordError as exc:
        exc.elements_before = before  # type: ignore[attr-defined]
        raise
    return bodies, strides, before


def decode_values(
    layout: Layout, dec: Decompressor, values: Sequence[Any], empty: Empty | None = None
) -> tuple[int, list[Any]]:
    """Decode stored values, each a block or a single element: (elements, batch per leaf).
    empty: makes the arrays fixed-shape leaves are copied into (codec.decode_fixed).

    Raises RecordError with ``elements_before`` set: how many elements the
    values before the bad one held, to name the bad block.
    """
    n, batch = _decode_values(layout, dec, values, empty)
    return n, undelta_rows(layout, batch) if layout.row_delta else batch


def _decode_values(
    layout: Layout, dec: Decompressor, values: Sequence[Any], empty: Empty | None
) -> tuple[int, list[Any]]:
    if layout.block_elements == 1 and layout.fixed_numeric and len(values) > 1:
        rows = raw_rows(values, layout.record_size)  # small raw records: checked at once
        if rows is not None:
            return len(values), decode_fixed(layout, rows, len(values), empty)
    bodies, strides, before = unpack_values(layout, dec, values)
    if layout.block_elements == 1:  # one element per value (format 1)
        try:
            return before, decode_batch(layout, bodies, empty)
        except RecordError as exc:
            exc.elements_before = before  # type: ignore[attr-defined]
            raise
    rs = layout.record_size
    if before and before == len(bodies) and len(set(strides)) == 1:  # one element each
        rows = np.frombuffer(b"".join(bodies), np.uint8).reshape(before, strides[0], -1)
        if strides[0] > 1:
            rows = rows.transpose(0, 2, 1).copy()
        return before, decode_fixed(layout, rows, before, empty)
    rows = np.empty((before, rs), np.uint8)  # every block lands here, unshuffled
    at = 0
    for body, stride in zip(bodies, strides):
        m = len(body) // rs
        unshuffle_into(body, rows[at : at + m], stride)
        at += m
    return before, decode_fixed(layout, rows, before, empty)


@functools.lru_cache(maxsize=256)
def layout_of_json(layout_json: str) -> Layout:
    """The Layout of a layout's JSON, parsed once per distinct layout."""
    return Layout.from_json(layout_json)


def block_geometry(layout_json: str) -> tuple[int, int]:
    """(k, record size) of a cache's layout: k = 1 (and size 0) for format 1 layouts, any
    layout that is not fixed, and one that is not ours to judge here (a reader of the
    layout reports it)."""
    try:
        layout = layout_of_json(layout_json)
    except ValueError:
        return 1, 0
    k = layout.block_elements
    return k, layout.record_size if k > 1 else 0


def block_elements(layout_json: str) -> int:
    """k of a cache's layout (see block_geometry)."""
    return block_geometry(layout_json)[0]
