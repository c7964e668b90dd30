"""Decode fixed-shape stored values straight into aligned batch arrays (one copy).

The general decoder (client/format/blocks.py ``decode_values`` -> codec ``decode_batch``)
joins a chunk's record bodies into one buffer, then copies each leaf's column
out of it, and allocates with numpy's default alignment (16 bytes). TensorFlow's
``from_generator`` hands a numpy array to the tensor it makes without a copy
only when its data is aligned to ``EIGEN_MAX_ALIGN_BYTES`` (64 here); otherwise
it copies the whole batch once more. On 602 KB float32 images that made four
passes over every byte between the fetched chunk and TF's tensor (join, column
copy, TF's copy, plus the CRC read); docs/design.md counts them.

Here each leaf's batch array is allocated 64-byte aligned and each record body
(or unshuffled block) is copied straight into its rows: one copy per byte, and
none in ``from_generator``. Same checks, same errors (RecordError with
``elements_before``) and the same values as ``decode_values``: the fidelity tests
compare both paths element for element.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from client.format.blocks import undelta_rows, unpack_values
from client.format.codec import Empty, RecordError
from client.format.layout import Layout
from client.format.values import Decompressor

#: TensorFlow aliases a numpy array whose data is aligned to this (EIGEN_MAX_ALIGN_BYTES).
ALIGN = 64
#: Below this record size, one element per value is left to the vectorized decode_batch
#: (one Python step per record would cost more than the copy it saves), and elements cut
#: out of their blocks are joined and unshuffled in one step (_pieces).
MIN_RECORD_BYTES = 16 << 10


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an align-byte boundary."""
    nbytes = math.prod(shape) * dtype.itemsize  # not np.prod: ~3 us a call
    raw = np.empty(nbytes + align, np.uint8)
    offset = -raw.ctypes.data % align
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def handles(layout: Layout) -> bool:
    """True when decode_into serves layout: fixed numeric leaves, in blocks or large records."""
    return layout.fixed_numeric and (
        layout.block_elements > 1 or layout.record_size >= MIN_RECORD_BYTES
    )


def decode_into(
    layout: Layout,
    dec: Decompressor,
    values: Sequence[Any],
    empty: Empty = aligned_empty,
    lo: int = 0,
    hi: int | None = None,
) -> tuple[int, list[np.ndarray]]:
    """Decode stored values of a layout that handles() accepts: (elements, array per leaf)
    of the elements [lo, hi) of the values (hi: all), the arrays made by empty (aligned to
    ALIGN, as aligned_empty's). Blocks are checked whole; only the kept rows are copied
    (a batch's first and last blocks are cut by its ends).

    Raises RecordError with ``elements_before`` set, as blocks.decode_values does.
    """
    if layout.block_elements == 1:
        return _records_into(layout, dec, values, empty, lo, hi)
    rs = layout.record_size
    bodies, strides, total = unpack_values(layout, dec, values, exact_records=True)
    lo, hi = _kept(lo, hi, total)
    n = hi - lo
    outs, columns = _outputs(layout, empty, n)
    if not n:
        return 0, outs
    at = 0  # the first element of the piece, among all the values'
    for m, src, stride in _pieces(bodies, strides, total, rs):
        r0, r1 = max(lo, at) - at, min(hi, at + m) - at  # the piece's rows to keep
        at += m
        if r0 >= r1:
            continue
        row = at - m + r0 - lo  # where they go
        if stride == 1:
            rows = src.reshape(m, rs)[r0:r1]
            for col, start, end in columns:
                col[row : row + r1 - r0] = rows[:, start:end]
        else:  # the block is stored byte-shuffled (client/format/blocks.py): unshuffle per leaf
            planes = src[:, r0:r1]
            for col, start, end in columns:
                unshuffle_words(
                    planes[:, :, start // stride : end // stride], col[row : row + r1 - r0]
                )
    return n, undelta_rows(layout, outs) if layout.row_delta else outs  # in place: writable


def _kept(lo: int, hi: int | None, total: int) -> tuple[int, int]:
    """[lo, hi) within [0, total) (hi None: to the end)."""
    lo = min(lo, total)
    return lo, total if hi is None else max(lo, min(hi, total))


def _outputs(
    layout: Layout, empty: Empty, n: int
) -> tuple[list[np.ndarray], list[tuple[np.ndarray, int, int]]]:
    """The n-row array of each leaf, made by empty, and each leaf of some bytes as (its
    array's (n, bytes) uint8 rows, where it starts and ends in a record)."""
    outs = [empty((n, *leaf.fixed_shape), leaf.np_dtype) for leaf in layout.leaves]
    columns, off = [], 0
    for leaf, out in zip(layout.leaves, outs):
        if leaf.nbytes:
            rows = out.reshape(n, math.prod(leaf.fixed_shape)).view(np.uint8)
            columns.append((rows, off, off + leaf.nbytes))
        off += leaf.nbytes
    return outs, columns


def _records_into(
    layout: Layout, dec: Decompressor, values: Sequence[Any], empty: Empty, lo: int, hi: int | None
) -> tuple[int, list[np.ndarray]]:
    """decode_into for one (large) element per value: each value checked, then copied into
    its rows while it is still in the CPU's cache (checking a whole chunk first, then copying
    it, reads every byte from memory twice: ~13 ms against ~11 ms for 154 MB of 602 KB
    records here)."""
    rs = layout.record_size
    lo, hi = _kept(lo, hi, len(values))
    outs, columns = _outputs(layout, empty, hi - lo)
    for j, value in enumerate(values):  # every value checked, in order, as unpack_values does
        try:
            body = dec.unpack(value)
            if len(body) != rs:
                raise RecordError(f"record has {len(body)} bytes, layout says {rs}")
        except RecordError as exc:
            exc.elements_before = j  # type: ignore[attr-defined]
            raise
        if lo <= j < hi:
            record = np.frombuffer(body, np.uint8)
            for col, start, end in columns:
                col[j - lo] = record[start:end]
    return hi - lo, undelta_rows(layout, outs) if layout.row_delta else outs


def _pieces(
    bodies: list[Any], strides: list[int], n: int, rs: int
) -> list[tuple[int, np.ndarray, int]]:
    """(m, its m records, stride) per body: rows (m, rs) for stride 1, else a shuffled
    block's byte planes (stride, m, rs // stride). Small bodies of one record each, of one
    stride (elements cut out of their blocks by a shuffled read) are joined into one piece:
    one NumPy step for all, ~0.1 ms per 4 MiB, instead of ~2 us per record."""
    if (
        n > 1
        and rs < MIN_RECORD_BYTES
        and len(bodies) == n
        and all(len(body) == rs for body in bodies)
        and len(set(strides)) == 1
    ):
        joined, stride = np.frombuffer(b"".join(bodies), np.uint8), strides[0]
        if stride == 1:
            return [(n, joined.reshape(n, rs), 1)]
        return [(n, joined.reshape(n, stride, rs // stride).transpose(1, 0, 2), stride)]
    return [
        (
            len(body) // rs,
            np.frombuffer(body, np.uint8).reshape(
                (len(body) // rs, rs) if stride == 1 else (stride, len(body) // rs, rs // stride)
            ),
            stride,
        )
        for body, stride in zip(bodies, strides)
    ]


def unshuffle_words(planes: np.ndarray, out: np.ndarray) -> None:
    """Interleave byte planes (stride, m, w) into out, a uint8 (m, w * stride) view.

    Byte b of each little-endian stride-byte word comes from plane b. For strides of
    2, 4 and 8 this assembles whole words with shifts and ors (numpy loops over
    words), 2.5x faster here than numpy's byte-by-byte transposing copy, which
    remains for other strides.
    """
    stride, m, w = planes.shape
    if stride not in (2, 4, 8):
        out.reshape(m, w, stride)[:] = planes.transpose(1, 2, 0)
        return
    words = out.view(np.dtype(f"<u{stride}")).reshape(m, w)
    np.copyto(words, planes[0], casting="unsafe")
    part = np.empty_like(words)
    for b in range(1, stride):
        np.copyto(part, planes[b], casting="unsafe")
        np.left_shift(part, 8 * b, out=part)
        np.bitwise_or(words, part, out=words)
