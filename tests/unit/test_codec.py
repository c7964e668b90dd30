"""The record format (client/format/codec.py, layout.py, values.py): round trips, corruption
detection,
framing.

No network and no TensorFlow: the codec must stand on numpy, zstandard and ml_dtypes.
Numeric values are drawn as raw bytes, so NaNs, infinities, negative zeros and
subnormals all occur; arrays are compared by dtype, shape and bytes.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.format import codec
from client.format import layout as layout_mod
from client.format.codec import RecordError, VarLeaf, decode_batch, encode_body, encode_fixed_batch
from client.format.layout import Layout, Leaf
from client.format.values import TAG_RAW, TAG_ZSTD, Compressor, Decompressor, split_chunk

ROOT = Path(__file__).resolve().parents[2]
NUMERIC = [d for d in layout_mod._DTYPES if d != "string"]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --------------------------------------------------------------------------- strategies


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


def layouts(fixed: bool = False, dtypes: list[str] | None = None, min_size: int = 0
            ) -> st.SearchStrategy[Layout]:
    return st.lists(leaves(dtypes, fixed), min_size=min_size, max_size=4).map(
        lambda ls: Layout(tuple(ls)))


@st.composite
def arrays(draw: st.DrawFn, leaf: Leaf) -> np.ndarray:
    """A value for leaf: a concrete shape for its unknowns, and arbitrary contents."""
    if leaf.shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    else:
        shape = tuple(draw(st.integers(0, 3)) if d is None else d for d in leaf.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if leaf.dtype == "string":
        items = draw(st.lists(st.binary(max_size=6) | st.sampled_from([b"", b"\x00", b"\x00\xff"]),
                              min_size=count, max_size=count))
        arr = np.empty(count, object)
        arr[:] = items
        return arr.reshape(shape)
    dt = leaf.np_dtype
    if leaf.dtype == "bool":
        raw = bytes(draw(st.lists(st.integers(0, 1), min_size=count, max_size=count)))
    else:
        n = count * dt.itemsize
        raw = draw(st.binary(min_size=n, max_size=n)
                   | st.sampled_from([b"\x00", b"\xff", b"\x7f"]).map(lambda b: b * n))
    return np.frombuffer(raw, dt).reshape(shape)


@st.composite
def batches(draw: st.DrawFn, layout_strategy: st.SearchStrategy[Layout], min_elements: int = 0,
            max_elements: int = 4) -> tuple[Layout, list[list[np.ndarray]]]:
    layout = draw(layout_strategy)
    n = draw(st.integers(min_elements, max_elements))
    return layout, [[draw(arrays(leaf)) for leaf in layout.leaves] for _ in range(n)]


# --------------------------------------------------------------------------- helpers


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
            dims = tuple(col.dims[dim_ends[i] - col.ranks[i]:dim_ends[i]].tolist())
            values = col.values[value_ends[i] - col.sizes[i]:value_ends[i]]
            elements[i].append(values.reshape(dims))
    return elements


def zstd_value(body: bytes) -> bytes:
    frame = zstandard.ZstdCompressor(level=1, write_checksum=True,
                                     write_content_size=True).compress(body)
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


# --------------------------------------------------------------------------- round trips


@SETTINGS
@given(batches(layouts()), st.sampled_from([1, 3, 19]))
def test_any_layout_round_trips_exactly_through_pack_and_decode(
        case: tuple[Layout, list[list[np.ndarray]]], level: int) -> None:
    layout, elements = case
    bodies = [encode_body(layout, e) for e in elements]
    values = [Compressor(level).pack(b) for b in bodies]
    batch = round_trip(layout, values)
    assert len(batch) == len(layout.leaves)
    assert_elements(layout, batch, elements)


@SETTINGS
@given(batches(layouts()))
def test_both_record_tags_decode_to_the_same_elements(
        case: tuple[Layout, list[list[np.ndarray]]]) -> None:
    layout, elements = case
    bodies = [encode_body(layout, e) for e in elements]
    assert_elements(layout, round_trip(layout, [zstd_value(b) for b in bodies]), elements)
    assert_elements(layout, round_trip(layout, [raw_value(b) for b in bodies]), elements)


@SETTINGS
@given(batches(layouts(fixed=True, dtypes=NUMERIC, min_size=1)))
def test_fixed_batch_encoding_agrees_with_per_element_encoding(
        case: tuple[Layout, list[list[np.ndarray]]]) -> None:
    layout, elements = case
    assert layout.fixed_numeric
    n = len(elements)
    stacked = [np.stack([e[j] for e in elements]) if n
               else np.empty((0, *leaf.shape), leaf.np_dtype)  # type: ignore[misc]
               for j, leaf in enumerate(layout.leaves)]
    rows = encode_fixed_batch(layout, stacked)
    assert rows.dtype == np.uint8 and rows.shape == (n, layout.record_size)
    assert [r.tobytes() for r in rows] == [encode_body(layout, e) for e in elements]
    assert_elements(layout, round_trip(layout, [Compressor().pack(r) for r in rows]), elements)


def test_fixed_batch_rows_of_one_byte_columns_are_contiguous_records() -> None:
    # found by hypothesis in CI: n x 1 columns made np.concatenate return F order, and
    # zstd refuses a row of that ("ndarray is not C-contiguous")
    layout = Layout((Leaf("bool", ()), Leaf("bool", ()), Leaf("int16", (0,))))
    rows = encode_fixed_batch(layout, [np.array([True, False]), np.array([False, True]),
                                       np.zeros((2, 0), np.int16)])
    assert rows.flags["C_CONTIGUOUS"]
    assert [Compressor().pack(r)[0] for r in rows] == [0x00, 0x00]  # raw + CRC, packed


@SETTINGS
@given(layouts())
def test_layout_survives_its_json_description(layout: Layout) -> None:
    text = layout.to_json()
    assert Layout.from_json(text) == layout
    assert json.loads(text)["format"] == 1  # one element per value: exactly format 1
    if layout.fixed_numeric:
        packed = Layout(layout.leaves, 7)
        text = packed.to_json()
        assert Layout.from_json(text) == packed
        assert json.loads(text)["format"] == layout_mod.FORMAT_VERSION == 2


@pytest.mark.parametrize("dtype", layout_mod._DTYPES)
def test_every_dtype_round_trips_as_a_scalar_a_matrix_and_a_ragged_leaf(dtype: str) -> None:
    dt = Leaf(dtype, None).np_dtype
    if dtype == "string":
        items = [b"", b"\x00", b"\x00\xff", b"abc", b"\xff" * 9, bytes(range(256))]
        matrix = np.empty(6, object)
        matrix[:] = items
        matrix = matrix.reshape(2, 3)
        scalar = np.array(b"\x00tail\x00", dtype=object)
    else:
        matrix = np.frombuffer(bytes(range(6 * dt.itemsize)), dt).reshape(2, 3)
        if dtype == "bool":
            matrix = np.array([[True, False, True], [False, False, True]])
        scalar = matrix.reshape(-1)[1].copy().reshape(())
    layout = Layout((Leaf(dtype, ()), Leaf(dtype, (2, 3)), Leaf(dtype, (None, 3)),
                     Leaf(dtype, None), Leaf(dtype, (0,))))
    elements = [
        [scalar, matrix, matrix[:1], matrix, np.empty(0, dt)],
        [scalar, matrix, matrix[:0], scalar, np.empty(0, dt)],
    ]
    for pack in (zstd_value, raw_value, Compressor().pack):
        batch = round_trip(layout, [pack(encode_body(layout, e)) for e in elements])
        assert_elements(layout, batch, elements)


def test_bfloat16_nan_payloads_and_signed_zeros_round_trip_bit_for_bit() -> None:
    bits = np.array([0x7FC0, 0x7FC1, 0xFFC0, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001], "<u2")
    values = bits.view(ml_dtypes.bfloat16)
    layout = Layout((Leaf("bfloat16", (8,)),))
    rows = encode_fixed_batch(layout, [values[None]])
    batch = round_trip(layout, [raw_value(rows[0].tobytes())])
    assert batch[0].dtype == np.dtype(ml_dtypes.bfloat16)
    assert batch[0].view("<u2").tolist() == [bits.tolist()]


def test_an_element_of_only_zero_size_components_round_trips() -> None:
    layout = Layout((Leaf("float32", (0,)), Leaf("string", (3, 0)), Leaf("int8", (None, 0))))
    assert not layout.fixed_numeric
    element = [np.empty(0, np.float32), np.empty((3, 0), object), np.empty((5, 0), np.int8)]
    values = [Compressor().pack(encode_body(layout, element)) for _ in range(3)]
    assert_elements(layout, round_trip(layout, values), [element] * 3)
    fixed = Layout((Leaf("float32", (0,)), Leaf("uint16", (2, 0))))
    assert fixed.fixed_numeric and fixed.record_size == 0
    rows = encode_fixed_batch(fixed, [np.empty((3, 0), np.float32), np.empty((3, 2, 0), "<u2")])
    assert rows.shape == (3, 0)
    batch = round_trip(fixed, [Compressor().pack(r) for r in rows])
    assert [b.shape for b in batch] == [(3, 0), (3, 2, 0)]


def test_a_layout_without_leaves_round_trips_empty_elements() -> None:
    layout = Layout(())
    assert encode_body(layout, []) == b""
    assert encode_fixed_batch(layout, []).shape == (0, 0)
    assert round_trip(layout, [Compressor().pack(b"")] * 4) == []


def test_zero_elements_decode_to_empty_batches() -> None:
    layout = Layout((Leaf("int32", (2,)), Leaf("string", (None,)), Leaf("float64", None)))
    batch = decode_batch(layout, [])
    assert batch[0].shape == (0, 2)
    assert isinstance(batch[1], VarLeaf) and len(batch[1].values) == 0
    assert isinstance(batch[2], VarLeaf) and len(batch[2].ranks) == 0
    fixed = Layout((Leaf("int32", (2,)),))
    assert encode_fixed_batch(fixed, [np.empty((0, 2), np.int32)]).shape == (0, 8)
    assert decode_batch(fixed, [])[0].shape == (0, 2)


def test_compressible_bodies_use_zstd_and_incompressible_ones_stay_raw() -> None:
    c = Compressor()
    assert c.pack(bytes(4096))[0] == TAG_ZSTD
    noise = np.random.default_rng(0).bytes(4096)
    assert c.pack(noise)[0] == TAG_RAW
    assert c.pack(b"")[0] == TAG_RAW


@pytest.mark.parametrize("compressible", [True, False], ids=["zstd", "raw"])
def test_a_value_packed_from_parts_is_the_value_of_their_concatenation(
        compressible: bool) -> None:
    """pack_parts joins the leaves of a record once, into the stored value itself (the
    raw value's CRC runs over the parts); the value is byte for byte pack()'s."""
    rng = np.random.default_rng(1)
    parts = [bytes(3000), bytes(8)] if compressible else [rng.bytes(3000), rng.bytes(8)]
    parts_value = Compressor().pack_parts([np.frombuffer(p, np.uint8) for p in parts])
    assert parts_value == Compressor().pack(b"".join(parts))
    assert parts_value[0] == (TAG_ZSTD if compressible else TAG_RAW)
    assert bytes(Decompressor().unpack(parts_value)) == b"".join(parts)


# --------------------------------------------------------------------------- corruption


def decode_or_error(layout: Layout, value: bytes) -> list[Any]:
    return decode_batch(layout, [Decompressor().unpack(value)])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches(layouts(min_size=1), min_elements=1, max_elements=1),
       st.sampled_from(["zstd", "raw"]), st.data())
def test_corrupting_any_byte_of_a_stored_value_never_yields_a_wrong_array(
        case: tuple[Layout, list[list[np.ndarray]]], tag: str, data: st.DataObject) -> None:
    """Raw records: every corruption is a RecordError (CRC-32 catches any burst of
    up to 32 bits). zstd records: a RecordError, or, where the corrupted frame
    still describes the very same body (a 1-byte raw block re-typed as an RLE
    block of that byte, say), exactly the original element."""
    layout, (element,) = case
    body = encode_body(layout, element)
    value = zstd_value(body) if tag == "zstd" else raw_value(body)
    for pos in range(len(value)):
        flip = data.draw(st.integers(1, 255), label=f"xor at {pos}")
        bad = bytearray(value)
        bad[pos] ^= flip
        try:
            batch = decode_or_error(layout, bytes(bad))
        except RecordError:
            continue
        assert tag == "zstd", f"raw record corrupted at byte {pos} decoded without error"
        assert bytes(Decompressor().unpack(bytes(bad))) == body
        assert_elements(layout, batch, [element])


@pytest.mark.parametrize("tag", ["zstd", "raw"])
def test_every_single_bit_flip_of_a_compressible_record_is_detected(tag: str) -> None:
    layout = Layout((Leaf("float32", (64,)), Leaf("string", (None,))))
    strings = np.empty(3, object)
    strings[:] = [b"", b"\x00\xff", b"abcabcabc"]
    body = encode_body(layout, [np.repeat(np.float32([1.5, np.nan]), 32), strings])
    value = zstd_value(body) if tag == "zstd" else raw_value(body)
    assert decode_or_error(layout, value)[0].tobytes() == body[:256]
    for pos in range(len(value)):
        for bit in range(8):
            bad = bytearray(value)
            bad[pos] ^= 1 << bit
            with pytest.raises(RecordError):
                decode_or_error(layout, bytes(bad))


def test_a_corrupt_zstd_content_size_is_an_error_not_a_huge_allocation() -> None:
    body = bytes(range(256)) * 4
    value = bytearray(zstd_value(body))
    params = zstandard.get_frame_parameters(bytes(value[1:]))
    assert params.content_size == len(body)
    # single-segment frame: magic (4), descriptor (1), then the content size
    fcs_bytes = {0: 1, 1: 2, 2: 4, 3: 8}[value[5] >> 6]
    for pos in range(6, 6 + fcs_bytes):
        bad = bytearray(value)
        bad[pos] = 0xFF
        with pytest.raises(RecordError):
            Decompressor().unpack(bytes(bad))


def test_a_large_record_never_decodes_to_a_different_body_after_corruption() -> None:
    """Bodies above the zstd window get a window descriptor, which zstd cannot verify.

    A changed window size still decodes to the very same body; every other
    corruption is detected.
    """
    rng = np.random.default_rng(1)
    body = np.repeat(rng.integers(0, 256, 200_000, np.uint8), 4).tobytes()  # 800 kB
    value = zstd_value(body)
    assert value[0] == TAG_ZSTD
    assert not value[5] & 0x20, "expected a frame with a window descriptor"
    dec = Decompressor()
    positions = list(range(0, 24)) + list(range(len(value) - 8, len(value)))
    positions += rng.integers(24, len(value) - 8, 40).tolist()
    for pos in positions:
        for flip in (0x01, 0x08, 0x80):
            bad = bytearray(value)
            bad[pos] ^= flip
            try:
                got = dec.unpack(bytes(bad))
            except RecordError:
                continue
            assert pos == 6, f"corruption at byte {pos} went undetected"
            assert bytes(got) == body


def test_an_empty_or_unknown_tagged_value_is_rejected() -> None:
    dec = Decompressor()
    with pytest.raises(RecordError, match="empty"):
        dec.unpack(b"")
    with pytest.raises(RecordError, match="unknown record tag 0x07"):
        dec.unpack(b"\x07abc")
    with pytest.raises(RecordError):
        dec.unpack(b"\x00\x00\x00")
    with pytest.raises(RecordError):
        dec.unpack(b"\x01")
    with pytest.raises(RecordError):
        dec.unpack(b"\x01\x28\xb5\x2f\xfd")


@SETTINGS
@given(layouts(min_size=1), st.binary(max_size=64))
def test_arbitrary_bytes_decode_to_a_record_error_or_a_consistent_batch(
        layout: Layout, body: bytes) -> None:
    try:
        batch = decode_batch(layout, [body])
    except RecordError:
        return
    element = split_decoded(layout, batch, 1)[0]
    for leaf, arr in zip(layout.leaves, element):
        if leaf.shape is not None:
            assert arr.ndim == len(leaf.shape)
            assert all(d is None or d == a for d, a in zip(leaf.shape, arr.shape))
    assert encode_body(layout, element) == body


def test_a_record_of_the_wrong_size_for_a_fixed_layout_is_rejected() -> None:
    layout = Layout((Leaf("int32", (2,)),))
    good = encode_body(layout, [np.int32([1, 2])])
    with pytest.raises(RecordError, match="record 1"):
        decode_batch(layout, [good, good + b"\x00", good])
    # the sizes add up, but no single record has the right size
    with pytest.raises(RecordError):
        decode_batch(layout, [good[:-1], good + b"\x00"])


def test_a_variable_leaf_whose_rank_contradicts_the_layout_is_rejected() -> None:
    writer = Layout((Leaf("uint8", None),))
    body = encode_body(writer, [np.zeros((2, 2), np.uint8)])
    with pytest.raises(RecordError):
        decode_batch(Layout((Leaf("uint8", (None,)),)), [body])
    with pytest.raises(RecordError):
        decode_batch(Layout((Leaf("uint8", (3, None)),)), [body])


# --------------------------------------------------------------------------- framing


def test_a_chunk_splits_into_its_values() -> None:
    values = [b"a", b"", b"\x00\xff", b"xyz" * 100]
    parts = split_chunk(*frame_chunk(values))
    assert [bytes(p) for p in parts] == values
    assert split_chunk(b"", b"") == []


@pytest.mark.parametrize(("lengths", "data"), [
    (struct.pack("<2I", 1, 2), b"ab"),          # lengths sum past the data
    (struct.pack("<2I", 1, 1), b"abc"),         # data left over
    (b"", b"stray"),                            # data without lengths
    (struct.pack("<I", 1) + b"\x00", b"a"),     # lengths not a whole number of u32
    (b"\x01\x00", b"a"),
    (struct.pack("<2I", 0xFFFFFFFF, 0xFFFFFFFF), b"a"),
], ids=["short-data", "extra-data", "no-lengths", "ragged-lengths", "half-u32", "huge"])
def test_malformed_chunk_framing_is_rejected(lengths: bytes, data: bytes) -> None:
    with pytest.raises(RecordError, match="chunk framing"):
        split_chunk(lengths, data)


# --------------------------------------------------------------------------- misuse


@pytest.mark.parametrize("dtype", ["float8", "int4", "object", "variant", "resource", "qint8"])
def test_an_unsupported_dtype_is_a_clear_value_error(dtype: str) -> None:
    with pytest.raises(ValueError, match=f"unsupported dtype '{dtype}'.*bfloat16"):
        Leaf(dtype, (2,))
    text = json.dumps({"format": 1, "leaves": [{"dtype": dtype, "shape": []}]})
    with pytest.raises(ValueError, match="unsupported dtype"):
        Layout.from_json(text)


@pytest.mark.parametrize("text", [
    "", "[]", "null", '{"format": 3, "leaves": []}', '{"format": 1}',
    '{"format": 2, "leaves": []}', '{"format": 2, "block_elements": 0, "leaves": []}',
    '{"format": 2, "block_elements": true, "leaves": []}',
    '{"format": 2, "block_elements": 4, "leaves": [{"dtype": "string", "shape": []}]}',
    '{"format": 1, "leaves": [{"dtype": "int8"}]}',
    '{"format": 1, "leaves": [{"dtype": "int8", "shape": [-1]}]}',
    '{"format": 1, "leaves": [{"dtype": "int8", "shape": ["2"]}]}',
    '{"format": 1, "leaves": [{"dtype": "int8", "shape": 3}]}',
])
def test_an_invalid_layout_description_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="invalid layout description"):
        Layout.from_json(text)


def test_an_element_that_does_not_match_the_layout_is_rejected() -> None:
    layout = Layout((Leaf("float32", (2,)), Leaf("int64", (None, 3))))
    with pytest.raises(RecordError, match="components"):
        encode_body(layout, [np.zeros(2, np.float32)])
    with pytest.raises(RecordError, match="shape"):
        encode_body(layout, [np.zeros(3, np.float32), np.zeros((1, 3), np.int64)])
    with pytest.raises(RecordError, match="shape"):
        encode_body(layout, [np.zeros(2, np.float32), np.zeros((1, 4), np.int64)])
    with pytest.raises(RecordError, match="shape"):
        encode_body(layout, [np.zeros(2, np.float32), np.zeros(3, np.int64)])
    with pytest.raises(RecordError, match="shape"):
        encode_fixed_batch(Layout((Leaf("float32", (2,)),)), [np.zeros((4, 3), np.float32)])


def test_the_codec_works_without_importing_tensorflow() -> None:
    code = ("import sys, numpy as np, client.format.codec as c, client.format.layout as l, "
            "client.format.values as v; "
            "lay = l.Layout((l.Leaf('bfloat16', (2,)), l.Leaf('string', None))); "
            "s = np.empty(1, object); s[:] = [b'x']; "
            "body = c.encode_body(lay, [np.zeros(2, 'float32'), s]); "
            "c.decode_batch(lay, [v.Decompressor().unpack(v.Compressor().pack(body))]); "
            "assert 'tensorflow' not in sys.modules, 'the codec imported TensorFlow'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def _random_body(rng: np.random.Generator, size: int = 4096) -> bytes:
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def test_compression_is_probed_rarely_once_records_stop_compressing() -> None:
    rng = np.random.default_rng(0)
    comp, dec = Compressor(), Decompressor()
    bodies = [_random_body(rng) for _ in range(16 + 640)]
    values = [comp.pack(b) for b in bodies]
    assert comp.attempts == Compressor.GIVE_UP + 640 // Compressor.PROBE_EVERY
    assert all(v[0] == TAG_RAW for v in values)
    assert [bytes(dec.unpack(v)) for v in values] == bodies


def test_a_compressible_record_found_by_a_probe_resumes_compressing_every_record() -> None:
    rng = np.random.default_rng(1)
    comp = Compressor()
    for _ in range(Compressor.GIVE_UP):
        comp.pack(_random_body(rng))
    zeros = bytes(4096)
    tags = [comp.pack(zeros)[0] for _ in range(Compressor.PROBE_EVERY + 10)]
    first = tags.index(TAG_ZSTD)
    assert first == Compressor.PROBE_EVERY - 1, "the probe found the compressible record"
    assert set(tags[first:]) == {TAG_ZSTD}, "every record is compressed again"


@SETTINGS
@given(batches(layouts(dtypes=NUMERIC), min_elements=1))
def test_the_vectorized_decoder_agrees_with_the_per_record_decoder(
        case: tuple[Layout, list[list[np.ndarray]]]) -> None:
    layout, elements = case
    if not layout.numeric_known_ranks:
        return  # unknown rank: only the per-record decoder applies
    bodies = [encode_body(layout, e) for e in elements]
    fast = codec._decode_known_ranks(layout, bodies)
    assert fast is not None, "well-formed records must take the vectorized path"
    slow = codec._decode_general(layout, bodies)
    for f, s in zip(fast, slow):
        if isinstance(s, codec.VarLeaf):
            assert isinstance(f, codec.VarLeaf)
            assert f.values.tobytes() == s.values.tobytes()
            for attr in ("sizes", "dims", "ranks"):
                assert getattr(f, attr).tolist() == getattr(s, attr).tolist()
        else:
            assert f.shape == s.shape and f.tobytes() == s.tobytes()


def test_the_vectorized_decoder_defers_every_corruption_to_the_exact_one() -> None:
    layout = Layout((Leaf("int32", (None, 3)), Leaf("float64", ())))
    bodies = [encode_body(layout, [np.arange(3 * k, dtype=np.int32).reshape(k, 3),
                                   np.float64(k)]) for k in range(5)]
    assert codec._decode_known_ranks(layout, bodies) is not None
    for i in range(len(bodies[3])):
        broken = bytearray(bodies[3])
        broken[i] ^= 0xFF
        batch = [*bodies[:3], bytes(broken), bodies[4]]
        try:
            exact = codec._decode_general(layout, batch)
        except codec.RecordError:
            assert codec._decode_known_ranks(layout, batch) is None
            with pytest.raises(codec.RecordError):
                decode_batch(layout, batch)
        else:  # a payload byte: both decode it, to the same values
            fast = codec._decode_known_ranks(layout, batch)
            assert fast is not None
            assert fast[0].values.tobytes() == exact[0].values.tobytes()
