"""The record format: one dataset element as bytes, independent of TensorFlow.

An element is flattened (TensorFlow's ``tf.nest.flatten(..., expand_composites=True)``)
into *leaves*: dense arrays, each with a dtype and a shape from the cache's
:class:`Layout` (client/format/layout.py). A record's *body* is the concatenation of its leaves:

* a leaf whose layout shape is fully known has no header; a leaf with unknown
  dimensions (or unknown rank) starts with ``u8 rank`` and ``rank`` x ``u64``
  dimensions;
* numeric payloads are the array's bytes, little-endian, C order;
* string payloads are ``n`` x ``u64`` lengths followed by the bytes.

The stored *value* wraps the body with a one-byte tag (client/format/values.py).
docs/format.md is the normative description.

Decoding works on whole chunks: :func:`decode_batch` turns n record bodies into
one stacked array per leaf (or, for variable leaves, a :class:`VarLeaf` with
the concatenated values and per-element shapes), never a Python object per
element on the fixed-shape path.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from client.format.layout import MAX_DIM, MAX_RANK, Layout

_U64 = struct.Struct("<Q")


class RecordError(ValueError):
    """A stored value is corrupt or does not match the layout."""


@dataclass
class VarLeaf:
    """A batch of a variable-shape leaf: concatenated flat values plus shapes."""

    values: np.ndarray  # 1-D, all elements' items back to back
    sizes: np.ndarray  # int64 (n,): items per element
    dims: np.ndarray  # int64, all elements' dimensions back to back
    ranks: np.ndarray  # int64 (n,)

    def split(self) -> list[np.ndarray]:
        """The n elements' arrays (views into values)."""
        ends = np.cumsum(self.sizes).tolist()
        dim_ends = np.cumsum(self.ranks).tolist()
        dims = self.dims.tolist()
        out, start, dim_start = [], 0, 0
        for end, dim_end in zip(ends, dim_ends):
            out.append(self.values[start:end].reshape(dims[dim_start:dim_end]))
            start, dim_start = end, dim_end
        return out


# --------------------------------------------------------------------------- encode


def _as_bytes(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):  # as tf.constant encodes a Python str
        return x.encode("utf-8")
    try:
        return bytes(memoryview(x))
    except TypeError as exc:
        raise RecordError(f"a string component holds {type(x).__name__}, not bytes") from exc


def _encode_strings(arr: np.ndarray, out: list[bytes]) -> None:
    items = [_as_bytes(x) for x in arr.reshape(-1).tolist()]
    out.append(np.fromiter((len(x) for x in items), "<u8", len(items)).tobytes())
    out.extend(items)


def encode_body(layout: Layout, leaves: Sequence[Any]) -> bytes:
    """Encode one element's leaves (array-likes, in layout order) as a record body."""
    if len(leaves) != len(layout.leaves):
        raise RecordError(f"element has {len(leaves)} components, layout has {len(layout.leaves)}")
    out: list[bytes] = []
    for leaf, value in zip(layout.leaves, leaves):
        arr = np.asarray(value, dtype=leaf.np_dtype)
        if not _shape_matches(arr.shape, leaf.shape):
            raise RecordError(f"component shape {arr.shape} does not match layout {leaf.shape}")
        if not leaf.fixed:
            if arr.ndim > MAX_RANK:
                raise RecordError(f"component rank {arr.ndim} exceeds {MAX_RANK}")
            out.append(bytes([arr.ndim]))
            out.append(np.asarray(arr.shape, "<u8").tobytes())
        if leaf.is_string:
            _encode_strings(arr, out)
        else:
            out.append(np.ascontiguousarray(arr).tobytes())
    return b"".join(out)


def _shape_matches(shape: tuple[int, ...], layout_shape: tuple[int | None, ...] | None) -> bool:
    if layout_shape is None:
        return True
    return len(shape) == len(layout_shape) and all(
        want is None or want == got for got, want in zip(shape, layout_shape)
    )


def encode_fixed_batch(layout: Layout, leaves: Sequence[np.ndarray]) -> np.ndarray:
    """Encode n elements of a fixed-numeric layout at once: a (n, record_size) uint8 array.

    leaves holds one stacked array of shape (n, *leaf.shape) per layout leaf.
    """
    cols = fixed_columns(layout, leaves)
    if len(cols) == 1:
        return cols[0]
    # C order whatever the columns' shapes (n x 1 columns would make concatenate pick F
    # order, and a row of that is not one contiguous record)
    out = np.empty((cols[0].shape[0] if cols else 0, layout.record_size), np.uint8)
    return np.concatenate(cols, axis=1, out=out) if cols else out


def fixed_columns(layout: Layout, leaves: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The leaves of n elements of a fixed-numeric layout as (n, leaf bytes) uint8 arrays:
    row i of each, in order, is element i's record body. Views where the leaves are
    C-contiguous."""
    if not layout.fixed_numeric:
        raise RecordError("a batch encoded at once needs a layout of fixed-shape numeric leaves")
    if len(leaves) != len(layout.leaves):
        raise RecordError(f"batch has {len(leaves)} components, layout has {len(layout.leaves)}")
    arrays = [np.asarray(a, dtype=leaf.np_dtype) for leaf, a in zip(layout.leaves, leaves)]
    n = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
    cols = []
    for leaf, arr in zip(layout.leaves, arrays):
        if arr.shape != (n, *leaf.fixed_shape):
            raise RecordError(
                f"batch component shape {arr.shape} does not match "
                f"{n} elements of layout shape {leaf.shape}"
            )
        cols.append(np.ascontiguousarray(arr).reshape(n, leaf.size).view(np.uint8))
    return cols


def encode_batch(layout: Layout, batch: Sequence[Any], n: int) -> list[Any]:
    """Encode n elements given as one batch per leaf (decode_batch's output form).

    Returns one body per element: rows of a uint8 array for fixed-numeric
    layouts (no copy per element), bytes otherwise.
    """
    if layout.fixed_numeric:
        return list(encode_fixed_batch(layout, batch))
    columns = [col.split() if isinstance(col, VarLeaf) else col for col in batch]
    return [encode_body(layout, [col[i] for col in columns]) for i in range(n)]


# --------------------------------------------------------------------------- decode


def decode_batch(
    layout: Layout, bodies: Sequence[memoryview | bytes], empty: Empty | None = None
) -> list[Any]:
    """Decode n record bodies into one batch per leaf.

    Fixed numeric leaves come back as arrays of shape (n, *shape); fixed string
    leaves as object arrays of the same shape; variable leaves as VarLeaf. empty: see
    decode_fixed.
    """
    n = len(bodies)
    if layout.fixed_numeric:
        size = layout.record_size
        lengths = list(map(len, bodies))
        if lengths.count(size) != n:
            bad = next(i for i, ln in enumerate(lengths) if ln != size)
            raise RecordError(f"record {bad} has {lengths[bad]} bytes, layout says {size}")
        return decode_fixed(layout, b"".join(bodies), n, empty)
    if n and layout.numeric_known_ranks:
        fast = _decode_known_ranks(layout, bodies)
        if fast is not None:
            return fast
    return _decode_general(layout, bodies)


#: Makes an uninitialised array of a shape and dtype (np.empty's first two arguments).
Empty = Callable[[tuple[int, ...], np.dtype], np.ndarray]
#: decode_fixed's leaves start on multiples of this in the array they share.
_LEAF_ALIGN = 64
#: decode_fixed copies smaller batches of several leaves into arrays of their own: malloc's
#: bins reuse small arrays well, and one array from empty would cost more (~5 us for one
#: element) than it saves.
_SHARED_MIN_BYTES = 256 << 10


def decode_fixed(
    layout: Layout, joined: Any, n: int, empty: Empty | None = None
) -> list[np.ndarray]:
    """n records of a fixed-numeric layout, back to back in joined (or the rows of an (n,
    record size) uint8 array): one array per leaf.

    One leaf: a view of joined. Several: each copied out of the rows; from
    _SHARED_MIN_BYTES on, into its part of one array made by empty, so a chunk makes one
    array, not one per leaf: a pass's reused buffers (client/read/assembly/buffers.py) spare the
    page faults of fresh arrays, ~5 ms per 4 MiB chunk of 1 KB records in two leaves.
    """
    if isinstance(joined, np.ndarray) and joined.ndim == 2:  # rows of a wider array
        rows = joined
    else:
        rows = np.frombuffer(joined, np.uint8).reshape(n, layout.record_size)
    if len(layout.leaves) == 1 or empty is None or rows.nbytes < _SHARED_MIN_BYTES:
        out, off = [], 0
        for leaf in layout.leaves:
            col = rows[:, off : off + leaf.nbytes]
            if len(layout.leaves) > 1 or not col.flags.c_contiguous:
                col = np.ascontiguousarray(col)
            out.append(col.view(leaf.np_dtype).reshape((n, *leaf.fixed_shape)))
            off += leaf.nbytes
        return out
    spans = [-(-n * leaf.nbytes // _LEAF_ALIGN) * _LEAF_ALIGN for leaf in layout.leaves]
    shared = empty((sum(spans),), np.dtype(np.uint8))
    out, off, at = [], 0, 0
    for leaf, span in zip(layout.leaves, spans):
        col = shared[at : at + n * leaf.nbytes].reshape(n, leaf.nbytes)
        np.copyto(col, rows[:, off : off + leaf.nbytes])
        out.append(col.view(leaf.np_dtype).reshape((n, *leaf.fixed_shape)))
        off += leaf.nbytes
        at += span
    return out


def _ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ranges [starts[i], starts[i] + lengths[i]) as one index array."""
    total = int(lengths.sum())
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + (np.arange(total, dtype=np.int64) - offsets)


def _decode_known_ranks(layout: Layout, bodies: Sequence[memoryview | bytes]) -> list[Any] | None:
    """decode_batch for numeric leaves of known rank, vectorized over the records.

    Walks all records' leaves at once with numpy index arithmetic instead of a
    Python loop per record. Returns None on anything unexpected (a bad rank,
    a dimension that disagrees with the layout, a record too short or too
    long, an absurd size): the per-record decoder then reports it precisely.
    """
    lengths = np.fromiter(map(len, bodies), np.int64, len(bodies))
    ends = np.cumsum(lengths)
    pos = ends - lengths
    buf = np.frombuffer(b"".join(bodies), np.uint8)
    out: list[Any] = []
    for leaf in layout.leaves:
        assert leaf.shape is not None
        itemsize = leaf.np_dtype.itemsize
        if leaf.fixed:
            nbytes = leaf.nbytes
            if np.any(pos + nbytes > ends):
                return None
            rows = (
                buf[pos[:, None] + np.arange(nbytes)]
                if nbytes
                else np.empty((len(pos), 0), np.uint8)
            )
            out.append(rows.view(leaf.np_dtype).reshape((len(pos), *leaf.fixed_shape)))
            pos = pos + nbytes
            continue
        rank = len(leaf.shape)
        header = 1 + 8 * rank
        if np.any(pos + header > ends) or np.any(buf[pos] != rank):
            return None
        dims = buf[(pos + 1)[:, None] + np.arange(8 * rank)].view("<u8").reshape(-1, rank)
        if np.any(dims > (1 << 40)):
            return None  # let the exact decoder judge absurd dimensions
        dims = dims.astype(np.int64)
        known = [(i, d) for i, d in enumerate(leaf.shape) if d is not None]
        if any(np.any(dims[:, i] != d) for i, d in known):
            return None
        counts = np.prod(dims, axis=1)  # a variable leaf has rank >= 1
        pos = pos + header
        sizes = counts * itemsize
        if np.any(pos + sizes > ends):
            return None
        values = buf[_ragged_arange(pos, sizes)].view(leaf.np_dtype)
        out.append(VarLeaf(values, counts, dims.reshape(-1), np.full(len(pos), rank, np.int64)))
        pos = pos + sizes
    if np.any(pos != ends):
        return None
    return out


def _decode_general(layout: Layout, bodies: Sequence[memoryview | bytes]) -> list[Any]:
    per_leaf: list[list[Any]] = [[] for _ in layout.leaves]
    shapes: list[list[tuple[int, ...]]] = [[] for _ in layout.leaves]
    for body in bodies:
        buf = memoryview(body).cast("B")
        end = len(buf)
        pos = 0
        try:
            for i, leaf in enumerate(layout.leaves):
                shape: tuple[int, ...]
                if leaf.fixed:
                    shape = leaf.fixed_shape
                else:
                    rank = buf[pos]
                    _need(pos + 1 + 8 * rank, end, "dimensions")
                    shape = tuple(np.frombuffer(buf, "<u8", rank, pos + 1).tolist())
                    pos += 1 + 8 * rank
                    if not _shape_matches(shape, leaf.shape) or any(d > MAX_DIM for d in shape):
                        raise RecordError(
                            f"component {i} has shape {shape}, layout says {leaf.shape}"
                        )
                count = math.prod(shape)
                if leaf.is_string:
                    _need(pos + 8 * count, end, "string lengths")
                    lens = np.frombuffer(buf, "<u8", count, pos).tolist()
                    pos += 8 * count
                    _need(pos + sum(lens), end, "strings")
                    items = []
                    for ln in lens:
                        items.append(bytes(buf[pos : pos + ln]))
                        pos += ln
                    arr = np.empty(count, object)
                    arr[:] = items
                else:
                    nbytes = count * leaf.np_dtype.itemsize
                    _need(pos + nbytes, end, "values")
                    arr = np.frombuffer(buf, leaf.np_dtype, count, pos)
                    pos += nbytes
                per_leaf[i].append(arr)
                shapes[i].append(shape)
        except (ValueError, IndexError) as exc:
            if isinstance(exc, RecordError):
                raise
            raise RecordError(f"record body does not match the layout: {exc}") from exc
        if pos != end:
            raise RecordError(f"record body has {end - pos} trailing bytes")
    out: list[Any] = []
    for leaf, arrs, shp in zip(layout.leaves, per_leaf, shapes):
        if leaf.fixed:
            stacked = np.concatenate(arrs) if arrs else np.empty(0, leaf.np_dtype)
            out.append(stacked.reshape((len(bodies), *leaf.fixed_shape)))
        else:
            values = np.concatenate(arrs) if arrs else np.empty(0, leaf.np_dtype)
            ranks = np.fromiter((len(s) for s in shp), np.int64, len(shp))
            dims = np.fromiter((d for s in shp for d in s), np.int64)
            sizes = np.fromiter((len(a) for a in arrs), np.int64, len(arrs))
            out.append(VarLeaf(values, sizes, dims, ranks))
    return out


def _need(stop: int, end: int, what: str) -> None:
    if stop > end:
        raise RecordError(f"record body ends {stop - end} bytes short of its {what}")
