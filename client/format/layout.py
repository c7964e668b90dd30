"""A cache's layout: the leaves of its elements and how their records are stored.

An element is flattened (TensorFlow's ``tf.nest.flatten(..., expand_composites=True)``)
into *leaves*, each a :class:`Leaf` (a dtype and a shape, whose dimensions may
be unknown). The :class:`Layout` lists them and the storage geometry chosen at
write time: elements per stored value (blocks), the byte-shuffle stride and
the row-delta filter (client/format/blocks.py). It travels as JSON with the cache
(docs/format.md); client/format/codec.py encodes and decodes records by it.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMAT_VERSION = 2
#: Format 3 is format 2 plus the row-delta filter (client/format/blocks.py); written only by
#: layouts that use it, so that every other cache stays readable by format-2 readers.
FORMAT_ROW_DELTA = 3
#: Format 4 is format 3 plus plain raw blocks: a block stored raw (not worth its zstd frame)
#: holds its records as they are, not byte-shuffled (client/format/blocks.py). Written by
#: every layout with a shuffle stride above 1.
FORMAT_PLAIN_RAW = 4
#: Layouts of format 1 (no blocks: one element per stored value) are still read.
_READABLE_FORMATS = (1, 2, 3, 4)
#: The rank of a variable leaf is one byte in the record.
MAX_RANK = 255
MAX_DIM = (1 << 63) - 1
#: Bounds on a layout (client and daemon parse layouts they did not write): its JSON's
#: size and nesting, its leaves, an element's fixed payload and a block's body.
MAX_LAYOUT_JSON_BYTES = 1 << 20
MAX_LAYOUT_DEPTH = 8
MAX_LEAVES = 10_000
MAX_ELEMENT_BYTES = 2 << 30
MAX_BLOCK_BYTES = 64 << 20
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _numpy_dtype(name: str) -> np.dtype:
    if name == "string":
        return np.dtype(object)
    if name == "bfloat16":
        import ml_dtypes  # TensorFlow's own numpy bfloat16; light, no TF import

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name).newbyteorder("<")


_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "string",
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
        known = math.prod(d for d in shape if d is not None) * (
            8 if self.dtype == "string" else _numpy_dtype(self.dtype).itemsize
        )
        if known > MAX_ELEMENT_BYTES:
            raise ValueError(
                f"a {self.dtype} leaf of shape {list(shape)} takes {known} bytes; "
                f"an element may take at most {MAX_ELEMENT_BYTES} bytes"
            )
        object.__setattr__(self, "shape", shape)

    @functools.cached_property  # asked per chunk decoded, as the others here
    def fixed(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    @property
    def is_string(self) -> bool:
        return self.dtype == "string"

    @functools.cached_property
    def np_dtype(self) -> np.dtype:
        return _numpy_dtype(self.dtype)

    @functools.cached_property
    def fixed_shape(self) -> tuple[int, ...]:
        """The shape of a fixed leaf."""
        if self.shape is None or any(d is None for d in self.shape):
            raise ValueError(f"a leaf of shape {self.shape} has no fixed shape")
        return self.shape  # type: ignore[return-value]

    @functools.cached_property
    def size(self) -> int:
        """Number of items of a fixed leaf."""
        return math.prod(self.fixed_shape)

    @functools.cached_property
    def nbytes(self) -> int:
        """Payload bytes of a fixed numeric leaf."""
        return self.size * self.np_dtype.itemsize


def row_delta_leaf(leaf: Leaf) -> bool:
    """True for the leaves the row-delta filter applies to: fixed-shape uint8 of rank >= 2
    with at least two rows (images: height x width [x channels]); client/format/blocks.py."""
    return (
        leaf.dtype == "uint8"
        and leaf.fixed
        and len(leaf.fixed_shape) >= 2
        and leaf.fixed_shape[0] >= 2
    )


def _dimension(d: Any) -> int:
    if isinstance(d, (bool, np.bool_)):
        raise TypeError(f"dimension {d!r} is not an integer")
    value = operator.index(d)
    if not 0 <= value <= MAX_DIM:
        raise ValueError(f"dimension {value} is out of range")
    return value


@dataclass(frozen=True)
class Layout:
    """The flattened leaves of a cache's elements."""

    leaves: tuple[Leaf, ...]
    #: Elements per stored value (client/format/blocks.py); 1 for every non-fixed layout.
    block_elements: int = 1
    #: Byte-shuffle stride of a block's body (1: none); see client/format/blocks.py.
    block_shuffle: int = 1
    #: Rows of each image-like leaf (row_delta_leaf) stored as differences; client/format/blocks.py.
    row_delta: bool = False
    #: A raw block holds its records unshuffled; only zstd frames are shuffled (format 4).
    plain_raw: bool = False

    def __post_init__(self) -> None:
        for name in ("block_elements", "block_shuffle"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if len(self.leaves) > MAX_LEAVES:
            raise ValueError(f"{len(self.leaves)} leaves; an element may have at most {MAX_LEAVES}")
        fixed = sum(leaf.nbytes for leaf in self.leaves if leaf.fixed and not leaf.is_string)
        if fixed > MAX_ELEMENT_BYTES:
            raise ValueError(
                f"an element's fixed leaves take {fixed} bytes; an element may "
                f"take at most {MAX_ELEMENT_BYTES} bytes"
            )
        if self.block_elements > 1 and not self.fixed_numeric:
            raise ValueError("only layouts of fixed-shape numeric leaves pack elements into blocks")
        if self.block_elements > 1 and self.block_elements * self.record_size > MAX_BLOCK_BYTES:
            raise ValueError(
                f"blocks of {self.block_elements} records of {self.record_size} "
                f"bytes; a block's body may take at most {MAX_BLOCK_BYTES} bytes"
            )
        if self.block_shuffle > 1 and (
            self.block_elements == 1 or self.record_size % self.block_shuffle
        ):
            raise ValueError(
                f"block_shuffle {self.block_shuffle} needs blocks of records whose size it divides"
            )
        for flag in ("row_delta", "plain_raw"):
            if type(getattr(self, flag)) is not bool:
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.plain_raw and self.block_shuffle == 1:
            raise ValueError("plain_raw needs blocks stored byte-shuffled (block_shuffle > 1)")
        if self.row_delta and not any(map(row_delta_leaf, self.leaves)):
            raise ValueError("row_delta needs a fixed-shape uint8 leaf of rank >= 2")

    @functools.cached_property
    def numeric_known_ranks(self) -> bool:
        """True when every leaf is numeric with a known rank: decodable chunk-wide."""
        return all(not leaf.is_string and leaf.shape is not None for leaf in self.leaves)

    @functools.cached_property
    def fixed_numeric(self) -> bool:
        """True when every record has the same size and no per-record header."""
        return all(leaf.fixed and not leaf.is_string for leaf in self.leaves)

    @functools.cached_property
    def record_size(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def to_json(self) -> str:
        leaves = [
            {"dtype": leaf.dtype, "shape": None if leaf.shape is None else list(leaf.shape)}
            for leaf in self.leaves
        ]
        doc: dict[str, Any] = {"format": 1}  # exactly format 1: one element per value
        if self.block_elements > 1 or self.row_delta:
            doc = {
                "format": FORMAT_PLAIN_RAW
                if self.plain_raw
                else FORMAT_ROW_DELTA
                if self.row_delta
                else FORMAT_VERSION,
                "block_elements": self.block_elements,
                "block_shuffle": self.block_shuffle,
            }
            if self.row_delta or self.plain_raw:
                doc["row_delta"] = self.row_delta
            if self.plain_raw:
                doc["plain_raw"] = True
        return json.dumps(doc | {"leaves": leaves}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Layout:
        """Parse a layout's JSON; ValueError saying what is wrong. Bounded: JSON of at most
        MAX_LAYOUT_JSON_BYTES, nested at most MAX_LAYOUT_DEPTH deep (checked before parsing)."""
        try:
            _check_json_bounds(text)
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise TypeError(f"expected an object, got {type(doc).__name__}")
            if doc.get("format") not in _READABLE_FORMATS:
                raise ValueError(
                    f"record format {doc.get('format')!r}, this version reads "
                    f"{_READABLE_FORMATS}: upgrade shardcache or rebuild the cache"
                )
            block = (doc["block_elements"], doc["block_shuffle"]) if doc["format"] >= 2 else (1, 1)
            if doc["format"] >= FORMAT_ROW_DELTA:
                block = (*block, doc["row_delta"])
            if doc["format"] >= FORMAT_PLAIN_RAW:
                block = (*block, doc["plain_raw"])
            leaves = doc["leaves"]
            if not isinstance(leaves, list):
                raise TypeError("leaves must be a list")
            if len(leaves) > MAX_LEAVES:
                raise ValueError(f"{len(leaves)} leaves; an element may have at most {MAX_LEAVES}")
            out = []
            for d in leaves:
                if not isinstance(d, dict):
                    raise TypeError(f"a leaf is an object, got {type(d).__name__}")
                shape = d["shape"]
                if shape is not None and not isinstance(shape, list):
                    raise TypeError(f"shape {shape!r} is neither a list nor null")
                if shape is not None and not all(x is None or type(x) is int for x in shape):
                    raise TypeError(f"shape {shape!r} holds a non-integer dimension")
                out.append(Leaf(d["dtype"], None if shape is None else tuple(shape)))
            return cls(tuple(out), *block)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"invalid layout description: {exc}") from exc


def _check_json_bounds(text: str) -> None:
    """Refuse a layout's JSON that is too long or nested too deep, before parsing it."""
    if not isinstance(text, str):
        raise TypeError(f"a layout is JSON text, got {type(text).__name__}")
    if len(text) > MAX_LAYOUT_JSON_BYTES:
        raise ValueError(
            f"{len(text)} characters of JSON; a layout may take at most {MAX_LAYOUT_JSON_BYTES}"
        )
    brackets = np.frombuffer(_JSON_STRING.sub("", text).encode(errors="replace"), np.uint8)
    steps = np.isin(brackets, (ord("["), ord("{"))).astype(np.int32) - np.isin(
        brackets, (ord("]"), ord("}"))
    )
    depth = int(np.cumsum(steps).max()) if steps.size else 0
    if depth > MAX_LAYOUT_DEPTH:
        raise ValueError(
            f"JSON nested {depth} deep; a layout nests at most {MAX_LAYOUT_DEPTH} deep"
        )
