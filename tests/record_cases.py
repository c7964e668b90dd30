"""Hypothesis strategies for layouts and batches of their elements, and the exact comparison,
value and chunk framing helpers the record format's tests share (tests/unit/test_codec*.py).

Numeric values are drawn as raw bytes, so NaNs, infinities, negative zeros and subnormals
all occur; arrays are compared by dtype, shape and bytes.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
import zstandard
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from client.format import layout as layout_mod
from client.format.codec import VarLeaf, decode_batch
from client.format.layout import Layout, Leaf
from client.format.values import Decompressor, split_chunk

NUMERIC = [d for d in layout_mod._DTYPES if d != "string"]
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def leaves(draw: st.DrawFn, dtypes: list[str] | None = None, fixed: bool = False) -> Leaf:
    dtype = draw(st.sampled_from(dtypes or list(layout_mod._DTYPES)))
    dims = draw(st.lists(st.integers(0, 3), max_size=3))
    if fixed:
        return Leaf(dtype, tuple(dims))
    kind = draw(st.sampled_from(["fixed", "unknown dims", "unknown rank"]))
    if kind == "unknown rank":
        return Leaf(dtype, None)
    if kind == "unknown dims":
        mask = draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
        return Leaf(dtype, tuple(None if m else d for d, m in zip(dims, mask)))
    return Leaf(dtype, tuple(dims))


def layouts(
    fixed: bool = False, dtypes: list[str] | None = None, min_size: int = 0
) -> st.SearchStrategy[Layout]:
    return st.lists(leaves(dtypes, fixed), min_size=min_size, max_size=4).map(
        lambda ls: Layout(tuple(ls))
    )


@st.composite
def arrays(draw: st.DrawFn, leaf: Leaf) -> np.ndarray:
    """A value for leaf: a concrete shape for its unknowns, and arbitrary contents."""
    if leaf.shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    else:
        shape = tuple(draw(st.integers(0, 3)) if d is None else d for d in leaf.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if leaf.dtype == "string":
        items = draw(
            st.lists(
                st.binary(max_size=6) | st.sampled_from([b"", b"\x00", b"\x00\xff"]),
                min_size=count,
                max_size=count,
            )
        )
        arr = np.empty(count, object)
        arr[:] = items
        return arr.reshape(shape)
    dt = leaf.np_dtype
    if leaf.dtype == "bool":
        raw = bytes(draw(st.lists(st.integers(0, 1), min_size=count, max_size=count)))
    else:
        n = count * dt.itemsize
        raw = draw(
            st.binary(min_size=n, max_size=n)
            | st.sampled_from([b"\x00", b"\xff", b"\x7f"]).map(lambda b: b * n)
        )
    return np.frombuffer(raw, dt).reshape(shape)


@st.composite
def batches(
    draw: st.DrawFn,
    layout_strategy: st.SearchStrategy[Layout],
    min_elements: int = 0,
    max_elements: int = 4,
) -> tuple[Layout, list[list[np.ndarray]]]:
    layout = draw(layout_strategy)
    n = draw(st.integers(min_elements, max_elements))
    return layout, [[draw(arrays(leaf)) for leaf in layout.leaves] for _ in range(n)]


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    """Exact equality: dtype, shape and every byte (NaN payloads included)."""
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object
        got_items, want_items = got.reshape(-1).tolist(), want.reshape(-1).tolist()
        assert all(type(x) is bytes for x in got_items)
        assert got_items == want_items
    else:
        assert got.dtype == want.dtype
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def split_decoded(layout: Layout, batch: list[Any], n: int) -> list[list[np.ndarray]]:
    """decode_batch output back to per-element leaf arrays."""
    elements: list[list[np.ndarray]] = [[] for _ in range(n)]
    for leaf, col in zip(layout.leaves, batch):
        if leaf.fixed:
            assert isinstance(col, np.ndarray)
            assert col.shape == (n, *leaf.shape)  # type: ignore[misc]
            for i in range(n):
                elements[i].append(col[i, ...])
            continue
        assert isinstance(col, VarLeaf)
        assert col.sizes.dtype == col.dims.dtype == col.ranks.dtype == np.int64
        assert len(col.sizes) == len(col.ranks) == n
        assert col.values.ndim == 1 and col.values.dtype == leaf.np_dtype
        value_ends = np.cumsum(col.sizes)
        dim_ends = np.cumsum(col.ranks)
        assert value_ends[-1:].sum() == len(col.values) and dim_ends[-1:].sum() == len(col.dims)
        for i in range(n):
            dims = tuple(col.dims[dim_ends[i] - col.ranks[i] : dim_ends[i]].tolist())
            values = col.values[value_ends[i] - col.sizes[i] : value_ends[i]]
            elements[i].append(values.reshape(dims))
    return elements


def zstd_value(body: bytes) -> bytes:
    frame = zstandard.ZstdCompressor(
        level=1, write_checksum=True, write_content_size=True
    ).compress(body)
    return b"\x01" + frame


def raw_value(body: bytes) -> bytes:
    return b"\x00" + struct.pack("<I", zlib.crc32(body)) + body


def frame_chunk(values: list[bytes]) -> tuple[bytes, bytes]:
    return struct.pack(f"<{len(values)}I", *map(len, values)), b"".join(values)


def round_trip(layout: Layout, values: list[bytes]) -> list[Any]:
    lengths, data = frame_chunk(values)
    dec = Decompressor()
    return decode_batch(layout, [dec.unpack(v) for v in split_chunk(lengths, data)])


def assert_elements(layout: Layout, batch: list[Any], elements: list[list[np.ndarray]]) -> None:
    got = split_decoded(layout, batch, len(elements))
    for got_leaves, want_leaves in zip(got, elements):
        assert len(got_leaves) == len(want_leaves)
        for leaf, g, w in zip(layout.leaves, got_leaves, want_leaves):
            assert_same_array(g, w.astype(leaf.np_dtype) if w.dtype != leaf.np_dtype else w)
