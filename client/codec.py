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
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import zstandard

FORMAT_VERSION = 1
TAG_RAW = 0x00
TAG_ZSTD = 0x01
#: Keep the zstd frame only when it is at least this much smaller than the body.
MIN_COMPRESSION_RATIO = 1.2
_U64 = struct.Struct("<Q")
_CRC = struct.Struct("<I")


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
    def size(self) -> int:
        """Number of items of a fixed leaf."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        """Payload bytes of a fixed numeric leaf."""
        return self.size * self.np_dtype.itemsize


@dataclass(frozen=True)
class Layout:
    """The flattened leaves of a cache's elements."""

    leaves: tuple[Leaf, ...]

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
        return json.dumps({"format": FORMAT_VERSION, "leaves": leaves}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Layout:
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT_VERSION:
                raise ValueError(f"record format {doc.get('format')!r}, expected {FORMAT_VERSION}")
            return cls(tuple(
                Leaf(d["dtype"], None if d["shape"] is None else tuple(d["shape"]))
                for d in doc["leaves"]
            ))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"invalid layout description: {exc}") from exc


@dataclass
class VarLeaf:
    """A batch of a variable-shape leaf: concatenated flat values plus shapes."""

    values: np.ndarray  # 1-D, all elements' items back to back
    sizes: np.ndarray  # int64 (n,): items per element
    dims: np.ndarray  # int64, all elements' dimensions back to back
    ranks: np.ndarray  # int64 (n,)


# --------------------------------------------------------------------------- encode


def _encode_strings(arr: np.ndarray, out: list[bytes]) -> None:
    items = [x if isinstance(x, bytes) else bytes(x) for x in arr.reshape(-1).tolist()]
    out.append(np.fromiter((len(x) for x in items), "<u8", len(items)).tobytes())
    out.extend(items)


def encode_body(layout: Layout, leaves: Sequence[Any]) -> bytes:
    """Encode one element's leaves (array-likes, in layout order) as a record body."""
    if len(leaves) != len(layout.leaves):
        raise RecordError(f"element has {len(leaves)} components, layout has {len(layout.leaves)}")
    out: list[bytes] = []
    for leaf, value in zip(layout.leaves, leaves):
        arr = np.asarray(value, dtype=leaf.np_dtype)
        if not leaf.fixed:
            out.append(bytes([arr.ndim]))
            out.append(np.asarray(arr.shape, "<u8").tobytes())
        elif arr.shape != leaf.shape:
            raise RecordError(f"component shape {arr.shape} does not match layout {leaf.shape}")
        if leaf.is_string:
            _encode_strings(arr, out)
        else:
            out.append(np.ascontiguousarray(arr).tobytes())
    return b"".join(out)


def encode_fixed_batch(layout: Layout, leaves: Sequence[np.ndarray]) -> np.ndarray:
    """Encode n elements of a fixed-numeric layout at once: a (n, record_size) uint8 array."""
    n = len(leaves[0]) if leaves else 0
    cols = [
        np.ascontiguousarray(np.asarray(a, dtype=leaf.np_dtype)).reshape(n, -1).view(np.uint8)
        for leaf, a in zip(layout.leaves, leaves)
    ]
    if len(cols) == 1:
        return cols[0]
    return np.concatenate(cols, axis=1) if cols else np.empty((n, 0), np.uint8)


class Compressor:
    """Turns bodies into stored values (not thread-safe: one per thread)."""

    def __init__(self, level: int = 1) -> None:
        self._zstd = zstandard.ZstdCompressor(level=level, write_checksum=True,
                                              write_content_size=True)

    def pack(self, body: bytes | memoryview) -> bytes:
        frame = self._zstd.compress(body)
        if len(frame) * MIN_COMPRESSION_RATIO <= len(body):
            return b"\x01" + frame
        return b"\x00" + _CRC.pack(zlib.crc32(body)) + bytes(body)


# --------------------------------------------------------------------------- decode


def split_chunk(lengths: bytes, data: bytes) -> list[memoryview]:
    """Split a chunk framed as (little-endian u32 lengths, concatenated data)."""
    sizes = np.frombuffer(lengths, "<u4")
    ends = np.cumsum(sizes, dtype=np.int64)
    if len(sizes) and int(ends[-1]) != len(data):
        raise RecordError(f"chunk framing: lengths sum to {int(ends[-1])}, data has {len(data)}")
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
            try:
                return self._zstd.decompress(value[1:])
            except zstandard.ZstdError as exc:
                raise RecordError(f"zstd frame is corrupt: {exc}") from exc
        if tag == TAG_RAW:
            if len(value) < 5:
                raise RecordError("raw record shorter than its header")
            (crc,) = _CRC.unpack_from(value, 1)
            body = value[5:]
            if zlib.crc32(body) != crc:
                raise RecordError("raw record fails its CRC-32 check")
            return body
        raise RecordError(f"unknown record tag 0x{tag:02x}")


def decode_batch(layout: Layout, bodies: Sequence[memoryview | bytes]) -> list[Any]:
    """Decode n record bodies into one batch per leaf.

    Fixed numeric leaves come back as arrays of shape (n, *shape); fixed string
    leaves as object arrays of the same shape; variable leaves as VarLeaf.
    """
    n = len(bodies)
    if layout.fixed_numeric:
        size = layout.record_size
        joined = b"".join(bodies)
        if len(joined) != n * size:
            bad = next(i for i, b in enumerate(bodies) if len(b) != size)
            raise RecordError(f"record {bad} has {len(bodies[bad])} bytes, layout says {size}")
        rows = np.frombuffer(joined, np.uint8).reshape(n, size)
        out, off = [], 0
        for leaf in layout.leaves:
            col = rows[:, off:off + leaf.nbytes]
            if len(layout.leaves) > 1:
                col = np.ascontiguousarray(col)
            out.append(col.view(leaf.np_dtype).reshape((n, *leaf.shape)))  # type: ignore[misc]
            off += leaf.nbytes
        return out
    return _decode_general(layout, bodies)


def _decode_general(layout: Layout, bodies: Sequence[memoryview | bytes]) -> list[Any]:
    per_leaf: list[list[Any]] = [[] for _ in layout.leaves]
    shapes: list[list[tuple[int, ...]]] = [[] for _ in layout.leaves]
    for body in bodies:
        buf = memoryview(body)
        pos = 0
        try:
            for i, leaf in enumerate(layout.leaves):
                if leaf.fixed:
                    shape = leaf.shape
                else:
                    rank = buf[pos]
                    shape = tuple(np.frombuffer(buf, "<u8", rank, pos + 1).tolist())
                    pos += 1 + 8 * rank
                count = int(np.prod(shape, dtype=np.int64))
                if leaf.is_string:
                    lens = np.frombuffer(buf, "<u8", count, pos)
                    pos += 8 * count
                    items = []
                    for ln in lens.tolist():
                        items.append(bytes(buf[pos:pos + ln]))
                        pos += ln
                    arr = np.empty(count, object)
                    arr[:] = items
                else:
                    nbytes = count * leaf.np_dtype.itemsize
                    arr = np.frombuffer(buf, leaf.np_dtype, count, pos)
                    pos += nbytes
                per_leaf[i].append(arr)
                shapes[i].append(shape)  # type: ignore[arg-type]
        except (ValueError, IndexError) as exc:
            raise RecordError(f"record body does not match the layout: {exc}") from exc
        if pos != len(buf):
            raise RecordError(f"record body has {len(buf) - pos} trailing bytes")
    out: list[Any] = []
    for leaf, arrs, shp in zip(layout.leaves, per_leaf, shapes):
        if leaf.fixed:
            stacked = np.concatenate(arrs) if arrs else np.empty(0, leaf.np_dtype)
            out.append(stacked.reshape((len(bodies), *leaf.shape)))  # type: ignore[misc]
        else:
            values = np.concatenate(arrs) if arrs else np.empty(0, leaf.np_dtype)
            ranks = np.fromiter((len(s) for s in shp), np.int64, len(shp))
            dims = np.fromiter((d for s in shp for d in s), np.int64)
            sizes = np.fromiter((len(a) for a in arrs), np.int64, len(arrs))
            out.append(VarLeaf(values, sizes, dims, ranks))
    return out
