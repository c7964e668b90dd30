"""The record format's refusals: corrupted values, malformed chunk framing, unsupported dtypes,
invalid layouts and elements that do not match them never decode to a wrong array."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from record_cases import (
    SETTINGS,
    assert_elements,
    batches,
    frame_chunk,
    layouts,
    raw_value,
    split_decoded,
    zstd_value,
)

from client.format.codec import RecordError, decode_batch, encode_body, encode_fixed_batch
from client.format.layout import Layout, Leaf
from client.format.values import TAG_ZSTD, Decompressor, split_chunk

# --------------------------------------------------------------------------- corruption


def decode_or_error(layout: Layout, value: bytes) -> list[Any]:
    return decode_batch(layout, [Decompressor().unpack(value)])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches(layouts(min_size=1), min_elements=1, max_elements=1),
    st.sampled_from(["zstd", "raw"]),
    st.data(),
)
def test_corrupting_any_byte_of_a_stored_value_never_yields_a_wrong_array(
    case: tuple[Layout, list[list[np.ndarray]]], tag: str, data: st.DataObject
) -> None:
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
    layout: Layout, body: bytes
) -> None:
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


@pytest.mark.parametrize(
    ("lengths", "data"),
    [
        (struct.pack("<2I", 1, 2), b"ab"),  # lengths sum past the data
        (struct.pack("<2I", 1, 1), b"abc"),  # data left over
        (b"", b"stray"),  # data without lengths
        (struct.pack("<I", 1) + b"\x00", b"a"),  # lengths not a whole number of u32
        (b"\x01\x00", b"a"),
        (struct.pack("<2I", 0xFFFFFFFF, 0xFFFFFFFF), b"a"),
    ],
    ids=["short-data", "extra-data", "no-lengths", "ragged-lengths", "half-u32", "huge"],
)
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


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "null",
        '{"format": 3, "leaves": []}',
        '{"format": 1}',
        '{"format": 2, "leaves": []}',
        '{"format": 2, "block_elements": 0, "leaves": []}',
        '{"format": 2, "block_elements": true, "leaves": []}',
        '{"format": 2, "block_elements": 4, "leaves": [{"dtype": "string", "shape": []}]}',
        '{"format": 1, "leaves": [{"dtype": "int8"}]}',
        '{"format": 1, "leaves": [{"dtype": "int8", "shape": [-1]}]}',
        '{"format": 1, "leaves": [{"dtype": "int8", "shape": ["2"]}]}',
        '{"format": 1, "leaves": [{"dtype": "int8", "shape": 3}]}',
    ],
)
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
