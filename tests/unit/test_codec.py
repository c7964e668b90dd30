"""The record format (client/format/codec.py, layout.py, values.py): round trips of any
layout, the fixed-batch and vectorized paths against the per-record ones, compression probing.

No network and no TensorFlow: the codec must stand on numpy, zstandard and ml_dtypes
(tests/record_cases.py draws the layouts and values). Corruption and misuse:
test_codec_errors.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from record_cases import (
    NUMERIC,
    SETTINGS,
    assert_elements,
    batches,
    layouts,
    raw_value,
    round_trip,
    zstd_value,
)

from client.format import codec
from client.format import layout as layout_mod
from client.format.codec import VarLeaf, decode_batch, encode_body, encode_fixed_batch
from client.format.layout import Layout, Leaf
from client.format.values import TAG_RAW, TAG_ZSTD, Compressor, Decompressor

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- round trips


@SETTINGS
@given(batches(layouts()), st.sampled_from([1, 3, 19]))
def test_any_layout_round_trips_exactly_through_pack_and_decode(
    case: tuple[Layout, list[list[np.ndarray]]], level: int
) -> None:
    layout, elements = case
    bodies = [encode_body(layout, e) for e in elements]
    values = [Compressor(level).pack(b) for b in bodies]
    batch = round_trip(layout, values)
    assert len(batch) == len(layout.leaves)
    assert_elements(layout, batch, elements)


@SETTINGS
@given(batches(layouts()))
def test_both_record_tags_decode_to_the_same_elements(
    case: tuple[Layout, list[list[np.ndarray]]],
) -> None:
    layout, elements = case
    bodies = [encode_body(layout, e) for e in elements]
    assert_elements(layout, round_trip(layout, [zstd_value(b) for b in bodies]), elements)
    assert_elements(layout, round_trip(layout, [raw_value(b) for b in bodies]), elements)


@SETTINGS
@given(batches(layouts(fixed=True, dtypes=NUMERIC, min_size=1)))
def test_fixed_batch_encoding_agrees_with_per_element_encoding(
    case: tuple[Layout, list[list[np.ndarray]]],
) -> None:
    layout, elements = case
    assert layout.fixed_numeric
    n = len(elements)
    stacked = [
        np.stack([e[j] for e in elements]) if n else np.empty((0, *leaf.shape), leaf.np_dtype)  # type: ignore[misc]
        for j, leaf in enumerate(layout.leaves)
    ]
    rows = encode_fixed_batch(layout, stacked)
    assert rows.dtype == np.uint8 and rows.shape == (n, layout.record_size)
    assert [r.tobytes() for r in rows] == [encode_body(layout, e) for e in elements]
    assert_elements(layout, round_trip(layout, [Compressor().pack(r) for r in rows]), elements)


def test_fixed_batch_rows_of_one_byte_columns_are_contiguous_records() -> None:
    # found by hypothesis in CI: n x 1 columns made np.concatenate return F order, and
    # zstd refuses a row of that ("ndarray is not C-contiguous")
    layout = Layout((Leaf("bool", ()), Leaf("bool", ()), Leaf("int16", (0,))))
    rows = encode_fixed_batch(
        layout, [np.array([True, False]), np.array([False, True]), np.zeros((2, 0), np.int16)]
    )
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
    layout = Layout(
        (
            Leaf(dtype, ()),
            Leaf(dtype, (2, 3)),
            Leaf(dtype, (None, 3)),
            Leaf(dtype, None),
            Leaf(dtype, (0,)),
        )
    )
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
def test_a_value_packed_from_parts_is_the_value_of_their_concatenation(compressible: bool) -> None:
    """pack_parts joins the leaves of a record once, into the stored value itself (the
    raw value's CRC runs over the parts); the value is byte for byte pack()'s."""
    rng = np.random.default_rng(1)
    parts = [bytes(3000), bytes(8)] if compressible else [rng.bytes(3000), rng.bytes(8)]
    parts_value = Compressor().pack_parts([np.frombuffer(p, np.uint8) for p in parts])
    assert parts_value == Compressor().pack(b"".join(parts))
    assert parts_value[0] == (TAG_ZSTD if compressible else TAG_RAW)
    assert bytes(Decompressor().unpack(parts_value)) == b"".join(parts)


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
    case: tuple[Layout, list[list[np.ndarray]]],
) -> None:
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
    bodies = [
        encode_body(layout, [np.arange(3 * k, dtype=np.int32).reshape(k, 3), np.float64(k)])
        for k in range(5)
    ]
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


def test_the_codec_works_without_importing_tensorflow() -> None:
    code = (
        "import sys, numpy as np, client.format.codec as c, client.format.layout as l, "
        "client.format.values as v; "
        "lay = l.Layout((l.Leaf('bfloat16', (2,)), l.Leaf('string', None))); "
        "s = np.empty(1, object); s[:] = [b'x']; "
        "body = c.encode_body(lay, [np.zeros(2, 'float32'), s]); "
        "c.decode_batch(lay, [v.Decompressor().unpack(v.Compressor().pack(body))]); "
        "assert 'tensorflow' not in sys.modules, 'the codec imported TensorFlow'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
