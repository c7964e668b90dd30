"""Block packing (formats 2-4): k elements per stored value, byte-shuffled, round-trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.format.blocks import BlockPacker, blocked, decode_values, shuffle
from client.format.codec import RecordError
from client.format.layout import Layout, Leaf
from client.format.values import Decompressor

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NUMERIC = [
    "bool",
    "int8",
    "uint8",
    "uint16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
]


@st.composite
def fixed_layouts(draw: st.DrawFn) -> Layout:
    leaves = draw(
        st.lists(
            st.tuples(st.sampled_from(NUMERIC), st.lists(st.integers(1, 6), max_size=2)),
            min_size=1,
            max_size=3,
        )
    )
    return Layout(tuple(Leaf(dtype, tuple(shape)) for dtype, shape in leaves))


def batch_of(
    layout: Layout, n: int, rng: np.random.Generator, levels: int = 256
) -> list[np.ndarray]:
    """n random elements; bytes of at most levels values (4: compressible, ~3x with zstd)."""
    out = []
    for leaf in layout.leaves:
        raw = rng.integers(0, levels, size=n * leaf.nbytes, dtype=np.uint8)
        if leaf.dtype == "bool":
            raw = raw % 2
        out.append(raw.view(leaf.np_dtype).reshape((n, *leaf.fixed_shape)))
    return out


@SETTINGS
@given(
    fixed_layouts(),
    st.integers(0, 300),
    st.lists(st.integers(1, 97), min_size=1),
    st.sampled_from([64, 1000, 4096]),
    st.integers(0, 2**32 - 1),
)
def test_any_fixed_layout_round_trips_through_blocks_whatever_the_batch_sizes(
    layout: Layout, n: int, cuts: list[int], target: int, seed: int
) -> None:
    layout = blocked(layout, target)
    data = batch_of(layout, n, np.random.default_rng(seed))
    packer, values, elements, at = BlockPacker(layout), [], 0, 0
    while at < n:
        step = min(cuts[at % len(cuts)], n - at)
        got, _, m = packer.add([col[at : at + step] for col in data], step)
        values += got
        elements += m
        at += step
    got, _, m = packer.flush()
    values += got
    elements += m
    assert elements == n
    assert len(values) == -(-n // layout.block_elements)  # only the last block is short
    count, decoded = decode_values(layout, Decompressor(), values)
    assert count == n
    for want, have in zip(data, decoded):
        assert have.dtype == want.dtype
        np.testing.assert_array_equal(have.view(np.uint8), want.view(np.uint8))


def test_blocks_are_sized_from_the_record_and_large_records_keep_format_1() -> None:
    small = blocked(Layout((Leaf("float32", (256,)), Leaf("int64", ()))))
    assert (small.block_elements, small.block_shuffle) == (254, 4)  # 256 KiB // 1032 B
    assert small.plain_raw and json.loads(small.to_json()) == {
        "format": 4,
        "block_elements": 254,
        "block_shuffle": 4,
        "row_delta": False,
        "plain_raw": True,
        "leaves": [{"dtype": "float32", "shape": [256]}, {"dtype": "int64", "shape": []}],
    }
    assert Layout.from_json(small.to_json()) == small
    for record in (32 << 10, (32 << 10) + 4):  # larger records stay one per value
        vector = blocked(Layout((Leaf("float32", (record // 4,)),)), 1 << 20)
        assert vector.block_elements == (32 if record == 32 << 10 else 1)
    image = blocked(Layout((Leaf("float32", (224, 224, 3)), Leaf("int64", ()))))
    assert (image.block_elements, image.block_shuffle) == (1, 1)
    assert json.loads(image.to_json()) == {
        "format": 1,
        "leaves": [{"dtype": "float32", "shape": [224, 224, 3]}, {"dtype": "int64", "shape": []}],
    }
    varying = blocked(Layout((Leaf("int32", (None,)),)))
    assert varying.block_elements == 1
    pixels = blocked(Layout((Leaf("uint8", (16, 16, 3)), Leaf("int64", ()))))
    assert (pixels.block_elements, pixels.block_shuffle, pixels.row_delta) == (337, 1, True)
    assert not pixels.plain_raw  # nothing shuffled: format 3
    photo = blocked(Layout((Leaf("uint8", (224, 224, 3)), Leaf("int64", ()))))
    assert json.loads(photo.to_json()) == {
        "format": 3,
        "block_elements": 1,
        "block_shuffle": 1,
        "row_delta": True,
        "leaves": [{"dtype": "uint8", "shape": [224, 224, 3]}, {"dtype": "int64", "shape": []}],
    }
    assert Layout.from_json(photo.to_json()) == photo
    for not_an_image in [
        (Leaf("uint8", (4096,)),),
        (Leaf("uint8", (1, 64)),),
        (Leaf("uint16", (64, 64)),),
        (Leaf("uint8", (64, 64)), Leaf("int32", (None,))),
    ]:
        assert not blocked(Layout(not_an_image)).row_delta, not_an_image


def test_image_rows_stored_as_differences_compress_where_the_pixels_alone_do_not() -> None:
    """Rows alike but each noisy (a photo's texture): zstd finds nothing in the rows
    themselves, and much in their differences."""
    rng = np.random.default_rng(0)
    steps = rng.integers(-1, 2, size=(8, 96, 96 * 3)).astype(np.uint8)
    steps[:, 0] = rng.integers(0, 256, size=(8, 96 * 3), dtype=np.uint8)
    images = np.cumsum(steps, axis=1, dtype=np.uint8).reshape(8, 96, 96, 3)
    filtered = blocked(Layout((Leaf("uint8", (96, 96, 3)),)), 2 * 96 * 96 * 3)  # 2 per block
    plain = Layout(filtered.leaves, filtered.block_elements, filtered.block_shuffle)
    ratios = {}
    for layout in (filtered, plain):
        values, raw, _ = BlockPacker(layout).add([images], 8)
        ratios[layout.row_delta] = raw / sum(map(len, values))
        n, (decoded,) = decode_values(layout, Decompressor(), values)
        assert n == 8
        np.testing.assert_array_equal(decoded, images)
    assert ratios[False] < 1.2 < 2.5 < ratios[True], ratios


def test_a_row_delta_layout_says_so_and_a_layout_claiming_it_wrongly_is_refused() -> None:
    with pytest.raises(ValueError, match="row_delta"):
        Layout.from_json(
            '{"format":3,"block_elements":1,"block_shuffle":1,"leaves":'
            '[{"dtype":"uint8","shape":[64,64]}]}'
        )
    with pytest.raises(ValueError, match="uint8 leaf of rank >= 2"):
        Layout((Leaf("float32", (64, 64)),), row_delta=True)


def test_shuffled_blocks_compress_token_ids_better_than_single_records() -> None:
    layout = blocked(Layout((Leaf("int32", (512,)),)))
    ids = np.random.default_rng(0).zipf(1.3, size=(200, 512)).clip(0, 31999).astype(np.int32)
    packer = BlockPacker(layout)
    values, raw, _ = packer.add([ids], 200)
    tail, tail_raw, _ = packer.flush()
    stored = sum(map(len, values + tail))
    assert (raw + tail_raw) / stored > 2.5
    assert all(v[0] == 0x01 for v in values)  # zstd frames


def test_a_block_that_is_not_whole_records_is_a_record_error_naming_where() -> None:
    layout = blocked(Layout((Leaf("int32", (4,)),)), 64)  # 4 elements per block
    values, _, _ = BlockPacker(layout).add([np.arange(32, dtype=np.int32).reshape(8, 4)], 8)
    from client.format.values import Compressor

    bad = Compressor().pack(b"\x00" * 17)
    with pytest.raises(RecordError, match="not a whole number") as info:
        decode_values(layout, Decompressor(), [values[0], bad])
    assert info.value.elements_before == 4  # type: ignore[attr-defined]
    oversized = Compressor().pack(b"\x00" * 16 * 5)
    with pytest.raises(RecordError, match="at most 4"):
        decode_values(layout, Decompressor(), [oversized])


def test_blocks_and_single_elements_keep_a_frame_only_when_it_is_1_25x_smaller() -> None:
    """Images (k = 1) are written as format 1 writes them, and blocks the same way: a
    frame only when >= 1.25x smaller."""
    layout = blocked(Layout((Leaf("uint8", (300000,)),)))
    assert layout.block_elements == 1
    rng = np.random.default_rng(0)
    # ~1.17x with zstd-1: one byte in four is a constant, the rest random
    data = rng.integers(0, 256, size=(4, 300000), dtype=np.uint8)
    data[:, ::4] = 0
    values, _, n = BlockPacker(layout).add([data], 4)
    assert n == 4 and all(v[0] == 0x00 for v in values)  # raw + CRC-32, as format 1 writes
    blocks = blocked(Layout((Leaf("uint8", (7000,)),)))
    values, _, _ = BlockPacker(blocks).add([data.reshape(-1)[: 80 * 7000].reshape(80, 7000)], 80)
    assert len(values) == 2 and all(v[0] == 0x00 for v in values)  # 1.17x: raw
    data[:, 1::4] = 0  # two bytes in four constant: ~1.9x
    values, _, _ = BlockPacker(blocks).add([data.reshape(-1)[: 80 * 7000].reshape(80, 7000)], 80)
    assert len(values) == 2 and all(v[0] == 0x01 for v in values)


@pytest.mark.parametrize("plain_raw", [True, False])
def test_a_raw_block_of_format_4_holds_its_records_as_they_are_and_a_frame_is_shuffled(
    plain_raw: bool,
) -> None:
    """Format 4 (plain_raw) stores a block that zstd does not shrink as its records, one
    copy from the batch's rows; formats 2 and 3 shuffle every block. Both read back, a
    chunk of both kinds of block included, through either decoder."""
    from client.format.fixed_decode import decode_into

    fresh = blocked(Layout((Leaf("float32", (64,)), Leaf("int64", ()))), 64 * 260)
    layout = fresh if plain_raw else Layout(fresh.leaves, fresh.block_elements, 4)
    assert json.loads(layout.to_json())["format"] == (4 if plain_raw else 2)
    k, rng = layout.block_elements, np.random.default_rng(5)
    random, repetitive = batch_of(layout, k, rng), batch_of(layout, k, rng, levels=4)
    data = [np.concatenate(parts) for parts in zip(random, repetitive, random)]
    values, _, n = BlockPacker(layout).add(data, 3 * k)
    assert n == 3 * k and [v[0] for v in values] == [0x00, 0x01, 0x00]
    rows = np.concatenate([a.reshape(3 * k, -1).view(np.uint8) for a in data], axis=1)
    body = np.frombuffer(values[0][5:], np.uint8)
    stored = rows[:k].reshape(-1) if plain_raw else shuffle(rows[:k], 4).reshape(-1)
    np.testing.assert_array_equal(body, stored)
    for decode in (decode_values, decode_into):
        count, got = decode(layout, Decompressor(), values)
        assert count == 3 * k
        for want, have in zip(data, got):
            np.testing.assert_array_equal(have, want)


def test_a_format_4_layout_names_its_flags_and_one_without_a_shuffle_is_refused() -> None:
    with pytest.raises(ValueError, match="plain_raw"):
        Layout.from_json(
            '{"format":4,"block_elements":2,"block_shuffle":4,"row_delta":false,'
            '"leaves":[{"dtype":"float32","shape":[4]}]}'
        )
    with pytest.raises(ValueError, match="block_shuffle > 1"):
        Layout((Leaf("uint8", (64,)),), 4, 1, plain_raw=True)
    with pytest.raises(ValueError, match=r"record format 5, this version reads \(1, 2, 3, 4\)"):
        Layout.from_json('{"format":5,"leaves":[]}')


def test_small_raw_records_are_checked_at_once_and_a_bad_one_is_named() -> None:
    """One element per value of a fixed layout, all raw: one join, the tags at once, each
    CRC-32; a chunk with a zstd value in it is unpacked value by value, to the same arrays."""
    from client.format.values import Compressor

    layout = Layout((Leaf("float32", (16,)), Leaf("int64", ())))
    data = batch_of(layout, 9, np.random.default_rng(8))
    values, _, _ = BlockPacker(layout).add(data, 9)
    assert all(v[0] == 0x00 for v in values)
    mixed = list(values)
    mixed[4] = Compressor().pack(b"\x00" * layout.record_size)
    assert mixed[4][0] == 0x01
    for chunk in (values, mixed):
        n, got = decode_values(layout, Decompressor(), chunk)
        assert n == 9
        for want, have in zip(data, got):
            expected = want.copy()
            if chunk is mixed:
                expected[4] = 0
            np.testing.assert_array_equal(have, expected)
    bad = list(values)
    bad[6] = bad[6][:-1] + bytes([bad[6][-1] ^ 1])
    with pytest.raises(RecordError, match="CRC-32") as info:
        decode_values(layout, Decompressor(), bad)
    assert info.value.elements_before == 6  # type: ignore[attr-defined]
