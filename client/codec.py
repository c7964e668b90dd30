"""The record format: one dataset element as bytes, independent of TensorFlow.

An element is flattened (TensorFlow's ``tf.nest.flatten(..., expand_composites=True)``)
into *leaves*: dense arrays, each with a dtype and a shape from the cache's
:class:`Layout`. A record's *body* is the concatenation of its leaves:

* a leaf whose layout shape is fully known has no header; a leaf with unknown
  dimensions (or unknown rank) starts with ``u8 rank`` and ``rank`` x ``u64``
  dimensions;
* numeric payloads are the array's bytes, little-endian, C order;
* string payloads are ``n`` x ``u64`` lengths followed by the bytes.

The stored *value* wraps the body with a one-byte tag: ``0x01`` + a zstd frame
(content size and checksum on), or ``0x00`` + ``u32`` CRC-32 + the body, used
when compression does not pay. docs/format.md is the normative description.

Decoding works on whole chunks: :func:`decode_batch` turns n stored values into
one stacked array per leaf (or, for variable leaves, a :class:`VarLeaf` with
the concatenated values and per-element shapes), never a Python object per
element on the fixed-shape path.
"""

from __future__ import annotations

import json
import math
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

try:  # ISA-L's CRC-32: zlib's polynomial and values, ~5x faster (docs/benchmarks.md)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without an isal wheel
    from zlib import crc32

FORMAT_VERSION = 2
#: Format 3 is format 2 plus the row-delta filter (client/blocks.py); written only by
#: layouts that use it, so that every other cache stays readable by format-2 readers.
FORMAT_ROW_DELTA = 3
#: Layouts of format 1 (no blocks: one element per stored value) are still read.
_READABLE_FORMATS = (1, 2, 3)
TAG_RAW = 0x00
TAG_ZSTD = 0x01
#: Keep the zstd frame only when it is at least this much smaller than the body.
MIN_COMPRESSION_RATIO = 1.2
_U64 = struct.Struct("<Q")
_CRC = struct.Struct("<I")
#: The rank of a variable leaf is one byte in the record.
MAX_RANK = 255
#: A zstd block of at most 128 KiB takes at least 4 bytes (header + RLE byte): no
#: genuine frame decompresses to more than this many times its own size.
_MAX_ZSTD_EXPANSION = 32768
#: Frame header descriptor bits that must be clear in our frames: unused, reserved,
#: dictionary id; and the content-checksum bit, which must be set.
_FHD_MUST_BE_CLEAR = 0x10 | 0x08 | 0x03
_FHD_CHECKSUM = 0x04
_MAX_DIM = (1 << 63) - 1


class RecordError(ValueError):
    """A stored value is corrupt or does not match the layout."""


def _numpy_dtype(name: str) -> np.dtype:
    if name == "string":
        return np.dtype(object)
    if name == "bfloat16":
        import ml_dtypes  # TensorFlow's own numpy bfloat16; light, no TF import

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name).newbyteorder("<")


_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "string",
)


@dataclass(frozen=True)
class Leaf:
    """One dense component of an element: dtype name and shape (None = unknown)."""

    dtype: str
    shape: tuple[int | None, ...] | None  # None: unknown rank

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; supported: {', '.join(_DTYPES)}")
        if self.shape is None:
            return
        try:
            if isinstance(self.shape, (str, bytes)):
                raise TypeError("a shape is a sequence of dimensions")
            shape = tuple(None if d is None else _dimension(d) for d in self.shape)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid shape {self.shape!r}: {exc}") from exc
        if len(shape) > MAX_RANK:
            raise ValueError(f"rank {len(shape)} exceeds the record format's {MAX_RANK}")
        object.__setattr__(self, "shape", shape)

    @property
    def fixed(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    @property
    def is_string(self) -> bool:
        return self.dtype == "string"

    @property
    def np_dtype(self) -> np.dtype:
        return _numpy_dtype(self.dtype)

    @property
    def fixed_shape(self) -> tuple[int, ...]:
        """The shape of a fixed leaf."""
        if self.shape is None or any(d is None for d in self.shape):
            raise ValueError(f"a leaf of shape {self.shape} has no fixed shape")
        return self.shape  # type: ignore[return-value]

    @property
    def size(self) -> int:
        """Number of items of a fixed leaf."""
        return math.prod(self.fixed_shape)

    @property
    def nbytes(self) -> int:
        """Payload bytes of a fixed numeric leaf."""
        return self.size * self.np_dtype.itemsize


def row_delta_leaf(leaf: Leaf) -> bool:
    """True for the leaves the row-delta filter applies to: fixed-shape uint8 of rank >= 2
    with at least two rows (images: height x width [x channels]); client/blocks.py."""
    return (leaf.dtype == "uint8" and leaf.fixed and len(leaf.fixed_shape) >= 2
            and leaf.fixed_shape[0] >= 2)


def _dimension(d: Any) -> int:
    if isinstance(d, (bool, np.bool_)):
        raise TypeError(f"dimension {d!r} is not an integer")
    value = operator.index(d)
    if not 0 <= value <= _MAX_DIM:
        raise ValueError(f"dimension {value} is out of range")
    return value


@dataclass(frozen=True)
class Layout:
    """The flattened leaves of a cache's elements."""

    leaves: tuple[Leaf, ...]
    #: Elements per stored value (client/blocks.py); 1 for every non-fixed layout.
    block_elements: int = 1
    #: Byte-shuffle stride of a block's body (1: none); see client/blocks.py.
    block_shuffle: int = 1
    #: Rows of each image-like leaf (row_delta_leaf) stored as differences; client/blocks.py.
    row_delta: bool = False

    def __post_init__(self) -> None:
        for name in ("block_elements", "block_shuffle"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.block_elements > 1 and not self.fixed_numeric:
            raise ValueError("only layouts of fixed-shape numeric leaves pack elements into "
                             "blocks")
        if self.block_shuffle > 1 and (self.block_elements == 1
                                       or self.record_size % self.block_shuffle):
            raise ValueError(f"block_shuffle {self.block_shuffle} needs blocks of records "
                             "whose size it divides")
        if type(self.row_delta) is not bool:
            raise ValueError(f"row_delta must be a bool, got {self.row_delta!r}")
        if self.row_delta and not any(map(row_delta_leaf, self.leaves)):
            raise ValueError("row_delta needs a fixed-shape uint8 leaf of rank >= 2")

    @property
    def numeric_known_ranks(self) -> bool:
        """True when every leaf is numeric with a known rank: decodable chunk-wide."""
        return all(not leaf.is_string and leaf.shape is not None for leaf in self.leaves)

    @property
    def fixed_numeric(self) -> bool:
        """True when every record has the same size and no per-record header."""
        return all(leaf.fixed and not leaf.is_string for leaf in self.leaves)

    @property
    def record_size(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def to_json(self) -> str:
        leaves = [
            {"dtype": leaf.dtype, "shape": None if leaf.shape is None else list(leaf.shape)}
            for leaf in self.leaves
        ]
        doc: dict[str, Any] = {"format": 1}  # exactly format 1: one element per value
        if self.block_elements > 1 or self.row_delta:
            doc = {"format": FORMAT_ROW_DELTA if self.row_delta else FORMAT_VERSION,
                   "block_elements": self.block_elements, "block_shuffle": self.block_shuffle}
            if self.row_delta:
                doc["row_delta"] = True
        return json.dumps(doc | {"leaves": leaves}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Layout:
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise TypeError(f"expected an object, got {type(doc).__name__}")
            if doc.get("format") not in _READABLE_FORMATS:
                raise ValueError(f"record format {doc.get('format')!r}, this version reads "
                                 f"{_READABLE_FORMATS}: upgrade shardcache or rebuild the cache")
            block = (doc["block_elements"], doc["block_shuffle"]) if doc["format"] >= 2 \
                else (1, 1)
            if doc["format"] >= FORMAT_ROW_DELTA:
                block = (*block, doc["row_delta"])
            leaves = doc["leaves"]
            if not isinstance(leaves, list):
                raise TypeError("leaves must be a list")
            out = []
            for d in leaves:
                shape = d["shape"]
                if shape is not None and not isinstance(shape, list):
                    raise TypeError(f"shape {shape!r} is neither a list nor null")
                if shape is not None and not all(x is None or type(x) is int for x in shape):
                    raise TypeError(f"shape {shape!r} holds a non-integer dimension")
                out.append(Leaf(d["dtype"], None if shape is None else tuple(shape)))
            return cls(tuple(out), *block)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"invalid layout description: {exc}") from exc


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
        want is None or want == got for got, want in zip(shape, layout_shape))


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
            raise RecordError(f"batch component shape {arr.shape} does not match "
                              f"{n} elements of layout shape {leaf.shape}")
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


class Compressor:
    """Turns bodies into stored values (not thread-safe: one per thread).

    Once GIVE_UP records in a row have not compressed well enough, only one in
    PROBE_EVERY is tried until one does: trying costs as much as compressing
    (random float images: ~1 ms per 600 KB record) and is thrown away.
    """

    GIVE_UP = 16
    PROBE_EVERY = 64

    def __init__(self, level: int = 1, min_ratio: float = MIN_COMPRESSION_RATIO) -> None:
        self._min_ratio = min_ratio
        self._zstd = zstandard.ZstdCompressor(level=level, write_checksum=True,
                                              write_content_size=True)
        self._misses = 0
        self._since_probe = 0
        self.attempts = 0  # compressions tried, for tests and stats

    def pack(self, body: Any) -> bytes:
        """The stored value of one body (bytes-like)."""
        return self.pack_parts((body,))

    def pack_parts(self, parts: Sequence[Any]) -> bytes:
        """The stored value of the body parts[0] + parts[1] + ..., joined only once."""
        if self._misses >= self.GIVE_UP:
            self._since_probe += 1
            if self._since_probe < self.PROBE_EVERY:
                return self._raw(parts)
            self._since_probe = 0
        self.attempts += 1
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        frame = self._zstd.compress(body)
        if len(frame) * self._min_ratio <= len(body):
            self._misses = 0
            return b"\x01" + frame
        self._misses += 1
        return self._raw((body,))

    @staticmethod
    def _raw(parts: Sequence[Any]) -> bytes:
        crc = 0
        for part in parts:
            crc = crc32(part, crc)
        return b"".join((b"\x00", _CRC.pack(crc), *parts))  # one copy of the body


# --------------------------------------------------------------------------- decode


def split_chunk(lengths: bytes, data: bytes) -> list[memoryview]:
    """Split a chunk framed as (little-endian u32 lengths, concatenated data)."""
    if len(lengths) % 4:
        raise RecordError(f"chunk framing: {len(lengths)} bytes of lengths is not a whole "
                          "number of u32")
    sizes = np.frombuffer(lengths, "<u4")
    ends = np.cumsum(sizes, dtype=np.int64)
    total = int(ends[-1]) if len(sizes) else 0
    if total != len(data):
        raise RecordError(f"chunk framing: lengths sum to {total}, data has {len(data)}")
    view = memoryview(data)
    starts = (ends - sizes).tolist()
    return [view[s:e] for s, e in zip(starts, ends.tolist())]


class Decompressor:
    """Turns stored values back into bodies, verifying checksums (one per thread)."""

    def __init__(self) -> None:
        self._zstd = zstandard.ZstdDecompressor()

    def unpack(self, value: memoryview | bytes) -> memoryview | bytes:
        if len(value) == 0:
            raise RecordError("empty record")
        tag = value[0]
        if tag == TAG_ZSTD:
            return self._unzstd(memoryview(value)[1:])
        if tag == TAG_RAW:
            if len(value) < 5:
                raise RecordError("raw record shorter than its header")
            (crc,) = _CRC.unpack_from(value, 1)
            body = value[5:]
            if crc32(body) != crc:
                raise RecordError("raw record fails its CRC-32 check")
            return body
        raise RecordError(f"unknown record tag 0x{tag:02x}")

    def _unzstd(self, frame: memoryview) -> bytes:
        """Decompress one frame as Compressor writes it, or raise RecordError.

        Beyond zstd's own checks (content checksum, content size), the frame
        header must declare both, and no bit zstd would ignore may be set; a
        content size no frame of this length can hold is refused before any
        allocation; bytes after the frame are an error.
        """
        try:
            params = zstandard.get_frame_parameters(frame)
        except zstandard.ZstdError as exc:
            raise RecordError(f"zstd frame header is corrupt: {exc}") from exc
        descriptor = frame[4]
        if descriptor & _FHD_MUST_BE_CLEAR or not descriptor & _FHD_CHECKSUM:
            raise RecordError(f"zstd frame header is corrupt: descriptor 0x{descriptor:02x}")
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or size > _MAX_ZSTD_EXPANSION * len(frame):
            raise RecordError(f"zstd frame header is corrupt: content size {size} for a "
                              f"{len(frame)}-byte frame")
        try:
            if size == 0:  # decompress() would return b"" unchecked: run the decoder
                dobj = self._zstd.decompressobj()
                body = dobj.decompress(frame)
                if not dobj.eof or dobj.unused_data:
                    raise zstandard.ZstdError("frame is truncated or has trailing data")
            else:
                body = self._zstd.decompress(frame, allow_extra_data=False)
        except (zstandard.ZstdError, MemoryError) as exc:
            raise RecordError(f"zstd frame is corrupt: {exc}") from exc
        if len(body) != size:
            raise RecordError(f"zstd frame is corrupt: {len(body)} bytes, header says {size}")
        return body


def decode_batch(layout: Layout, bodies: Sequence[memoryview | bytes]) -> list[Any]:
    """Decode n record bodies into one batch per leaf.

    Fixed numeric leaves come back as arrays of shape (n, *shape); fixed string
    leaves as object arrays of the same shape; variable leaves as VarLeaf.
    """
    n = len(bodies)
    if layout.fixed_numeric:
        size = layout.record_size
        lengths = list(map(len, bodies))
        if lengths.count(size) != n:
            bad = next(i for i, ln in enumerate(lengths) if ln != size)
            raise RecordError(f"record {bad} has {lengths[bad]} bytes, layout says {size}")
        return decode_fixed(layout, b"".join(bodies), n)
    if n and layout.numeric_known_ranks:
        fast = _decode_known_ranks(layout, bodies)
        if fast is not None:
            return fast
    return _decode_general(layout, bodies)


def decode_fixed(layout: Layout, joined: Any, n: int) -> list[np.ndarray]:
    """n records of a fixed-numeric layout, back to back in joined: one array per leaf."""
    rows = np.frombuffer(joined, np.uint8).reshape(n, layout.record_size)
    out, off = [], 0
    for leaf in layout.leaves:
        col = rows[:, off:off + leaf.nbytes]
        if len(layout.leaves) > 1:
            col = np.ascontiguousarray(col)
        out.append(col.view(leaf.np_dtype).reshape((n, *leaf.fixed_shape)))
        off += leaf.nbytes
    return out


def _ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ranges [starts[i], starts[i] + lengths[i]) as one index array."""
    total = int(lengths.sum())
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + (np.arange(total, dtype=np.int64) - offsets)


def _decode_known_ranks(layout: Layout, bodies: Sequence[memoryview | bytes]
                        ) -> list[Any] | None:
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
            rows = buf[pos[:, None] + np.arange(nbytes)] if nbytes else \
                np.empty((len(pos), 0), np.uint8)
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
        out.append(VarLeaf(values, counts, dims.reshape(-1),
                           np.full(len(pos), rank, np.int64)))
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
                    if not _shape_matches(shape, leaf.shape) or any(d > _MAX_DIM for d in shape):
                        raise RecordError(f"component {i} has shape {shape}, layout says "
                                          f"{leaf.shape}")
                count = math.prod(shape)
                if leaf.is_string:
                    _need(pos + 8 * count, end, "string lengths")
                    lens = np.frombuffer(buf, "<u8", count, pos).tolist()
                    pos += 8 * count
                    _need(pos + sum(lens), end, "strings")
                    items = []
                    for ln in lens:
                        items.append(bytes(buf[pos:pos + ln]))
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
