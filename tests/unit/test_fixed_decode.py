"""decode_into: fixed-shape values straight into aligned batch arrays, equal to decode_values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.format.blocks import BlockPacker, blocked, decode_values
from client.format.codec import RecordError
from client.format.fixed_decode import ALIGN, MIN_RECORD_BYTES, aligned_empty, decode_into, handles
from client.format.layout import Layout, Leaf
from client.format.values import Compressor, Decompressor
from tests.unit.test_blocks import SETTINGS, batch_of, fixed_layouts


def pack(layout: Layout, data: list[np.ndarray], n: int) -> list[bytes]:
    packer = BlockPacker(layout)
    values, _, _ = packer.add(data, n)
    return values + packer.flush()[0]


@SETTINGS
@given(
    fixed_layouts(),
    st.integers(0, 200),
    st.sampled_from([64, 1000, 4096]),
    st.integers(0, 2**32 - 1),
)
def test_blocks_decode_into_aligned_arrays_equal_to_the_general_decoder(
    layout: Layout, n: int, target: int, seed: int
) -> None:
    layout = blocked(layout, target)
    data = batch_of(layout, n, np.random.default_rng(seed))
    values = pack(layout, data, n)
    count, got = decode_into(layout, Decompressor(), values)
    want_count, want = decode_values(layout, Decompressor(), values)
    assert count == want_count == n
    for leaf, have, expected, original in zip(layout.leaves, got, want, data):
        assert have.shape == (n, *leaf.fixed_shape) and have.dtype == leaf.np_dtype
        assert have.flags.c_contiguous and (not have.nbytes or have.ctypes.data % ALIGN == 0)
        np.testing.assert_array_equal(have.view(np.uint8), expected.view(np.uint8))
        np.testing.assert_array_equal(have.view(np.uint8), original.view(np.uint8))


@pytest.mark.parametrize("compressible", [True, False])
def test_large_records_of_several_leaves_decode_into_aligned_arrays(compressible: bool) -> None:
    """Images with a label: one element per value, raw (CRC) or zstd, split per leaf."""
    layout = blocked(
        Layout((Leaf("float32", (160, 160, 3)), Leaf("int64", ()), Leaf("uint8", (5,))))
    )
    assert layout.block_elements == 1 and handles(layout)
    rng = np.random.default_rng(1)
    data = batch_of(layout, 7, rng)
    if compressible:
        data[0] = np.repeat(data[0][:, :1], 160, axis=1)
    values = pack(layout, data, 7)
    assert all(v[0] == (0x01 if compressible else 0x00) for v in values)
    count, got = decode_into(layout, Decompressor(), values)
    assert count == 7
    for have, original in zip(got, data):
        assert have.ctypes.data % ALIGN == 0
        np.testing.assert_array_equal(have, original)


def test_small_records_one_per_value_stay_on_the_vectorized_decoder() -> None:
    small = Layout((Leaf("float32", (256,)), Leaf("int64", ())))
    assert not handles(small)  # format 1 of 1 KB records: decode_batch is faster
    assert handles(blocked(small))
    assert handles(Layout((Leaf("uint8", (MIN_RECORD_BYTES,)),)))
    assert not handles(Layout((Leaf("uint8", (None,)),)))


def test_a_corrupt_record_is_a_record_error_counting_the_elements_before_it() -> None:
    layout = Layout((Leaf("uint8", (MIN_RECORD_BYTES,)), Leaf("int64", ())))
    data = batch_of(layout, 3, np.random.default_rng(2))
    values = pack(layout, data, 3)
    flipped = bytearray(values[2])
    flipped[-1] ^= 0xFF
    with pytest.raises(RecordError, match="CRC-32") as info:
        decode_into(layout, Decompressor(), [values[0], values[1], bytes(flipped)])
    assert info.value.elements_before == 2  # type: ignore[attr-defined]
    short = Compressor().pack(b"\x00" * (layout.record_size - 1))
    with pytest.raises(RecordError, match="layout says") as info:
        decode_into(layout, Decompressor(), [values[0], short])
    assert info.value.elements_before == 1  # type: ignore[attr-defined]


def test_aligned_empty_aligns_any_shape_and_dtype() -> None:
    for shape, dtype in [((0,), "float32"), ((3, 5), "int8"), ((7, 2, 2), "complex128")]:
        arr = aligned_empty(shape, np.dtype(dtype))
        assert arr.shape == shape and arr.dtype == np.dtype(dtype)
        assert arr.flags.c_contiguous and (not arr.nbytes or arr.ctypes.data % ALIGN == 0)


@pytest.mark.parametrize("levels", [4, 256])
@pytest.mark.parametrize("dtype", ["complex128", "float16", "int64", "int8"])
def test_blocks_of_every_shuffle_stride_decode_equal_to_the_general_decoder(
    dtype: str, levels: int
) -> None:
    """Strides 2, 4 and 8 assemble words with shifts; 16 (complex128) and 1 copy bytes.
    Compressible data (levels=4) is stored in shuffled frames, random data raw."""
    layout = blocked(Layout((Leaf(dtype, (3,)), Leaf("float32", (2,)))), 1000)
    assert layout.block_elements > 1
    data = batch_of(layout, 50, np.random.default_rng(3), levels)
    count, got = decode_into(layout, Decompressor(), pack(layout, data, 50))
    assert count == 50
    for have, original in zip(got, data):
        np.testing.assert_array_equal(have.view(np.uint8), original.view(np.uint8))


def test_image_rows_stored_as_differences_are_undone_in_the_aligned_arrays() -> None:
    """Format 3 (row_delta): the fast decoder adds the rows back, in place, still aligned."""
    layout = blocked(Layout((Leaf("uint8", (64, 96, 3)), Leaf("int64", ()))))
    assert layout.row_delta and handles(layout)
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, size=(9, 64, 96, 3), dtype=np.uint8)
    data = [images, np.arange(9, dtype=np.int64)]
    count, (got, labels) = decode_into(layout, Decompressor(), pack(layout, data, 9))
    assert count == 9 and got.ctypes.data % ALIGN == 0
    np.testing.assert_array_equal(got, images)
    np.testing.assert_array_equal(labels, np.arange(9))
