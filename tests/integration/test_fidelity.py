"""Fidelity: what comes out of the cache is exactly what went in, for every dtype and shape.

``cc.cache(src)`` (epoch 1 writing through, epoch 2 reading back), a second ``cc.cache(src)``
on the READY cache and ``cc.dataset(name)`` must give the elements of ``src`` and of
``src.cache()`` bit for bit, with ``src.element_spec`` and ``src.cache()``'s cardinality
(tests/fidelity.py: ``assert_faithful``). Structures, composites, random specs and other
processes: test_fidelity_structures.py.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from fidelity import (  # noqa: E402
    DTYPES,
    STRINGS,
    UNKNOWN,
    assert_faithful,
    elements_of,
    generated,
    rng_for,
    values,
)

# --------------------------------------------------------------------------- every dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_shape_elements_of_every_dtype_round_trip_exactly(cc, name, dtype) -> None:
    """Scalars and fixed shapes, sliced from tensors: the batched write path."""
    rng = rng_for(dtype)
    src = tf.data.Dataset.from_tensor_slices(
        {
            "scalar": values(dtype, (7,), rng),
            "matrix": values(dtype, (7, 2, 3), rng),
        }
    )
    assert_faithful(cc, name, src)


@pytest.mark.parametrize("dtype", DTYPES)
def test_variable_shape_elements_of_every_dtype_round_trip_exactly(cc, name, dtype) -> None:
    """Unknown dimensions that change from element to element, unknown rank, empties."""
    rng = rng_for(dtype + "var")
    spec = (
        tf.TensorSpec((), tf.as_dtype(dtype)),
        tf.TensorSpec((None,), tf.as_dtype(dtype)),
        tf.TensorSpec((None, 4), tf.as_dtype(dtype)),
        tf.TensorSpec((2, None), tf.as_dtype(dtype)),
        tf.TensorSpec(None, tf.as_dtype(dtype)),
        tf.TensorSpec((0,), tf.as_dtype(dtype)),
    )
    shapes = [(3, 0, 1, (2, 2)), (0, 2, 0, ()), (5, 1, 3, (1, 0, 2)), (1, 3, 2, (4,))]
    elements = [
        (
            values(dtype, (), rng),
            values(dtype, (a,), rng),
            values(dtype, (b, 4), rng),
            values(dtype, (2, c), rng),
            values(dtype, d, rng),
            values(dtype, (0,), rng),
        )
        for a, b, c, d in shapes
    ]
    runs = [0]
    assert_faithful(cc, name, generated(elements, spec, runs=runs), runs)


def test_bfloat16_elements_round_trip_exactly(cc, name) -> None:
    bits = np.array(
        [0x7FC0, 0x7FC1, 0xFFC0, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x3F80], np.uint16
    )
    src = tf.data.Dataset.from_tensor_slices(bits.view(ml_dtypes.bfloat16).reshape(3, 3))
    assert src.element_spec.dtype == tf.bfloat16
    assert_faithful(cc, name, src)
    got = np.stack([e.numpy() for e in cc.dataset(name)])
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert got.view(np.uint16).tolist() == bits.reshape(3, 3).tolist()


def test_strings_with_arbitrary_bytes_round_trip_exactly(cc, name) -> None:
    src = tf.data.Dataset.from_tensor_slices(tf.constant(STRINGS))
    assert_faithful(cc, name, src)
    assert [bytes(e.numpy()) for e in cc.dataset(name)] == STRINGS


# --------------------------------------------------------------------------- shapes


def test_scalars_round_trip_exactly(cc, name) -> None:
    src = tf.data.Dataset.range(5).map(
        lambda i: (i, tf.cast(i, tf.float32) / 3, tf.strings.as_string(i), i > 2)
    )
    assert_faithful(cc, name, src)


def test_empty_tensors_round_trip_with_their_shapes(cc, name) -> None:
    src = tf.data.Dataset.range(4).map(
        lambda i: {
            "empty": tf.zeros((0,), tf.float32),
            "rows": tf.zeros((3, 0), tf.int64),
            "strings": tf.fill((0, 2), "x"),
            "value": i,
        }
    )
    assert_faithful(cc, name, src)


def test_an_element_of_only_zero_size_components_round_trips(cc, name) -> None:
    src = tf.data.Dataset.range(5).map(
        lambda i: (
            tf.zeros((0,), tf.float32),
            tf.zeros((3, 0), tf.string),
            tf.zeros((0, 0, 2), tf.bool),
        )
    )
    assert_faithful(cc, name, src)


def test_a_single_zero_size_component_round_trips(cc, name) -> None:
    src = tf.data.Dataset.from_tensor_slices(tf.zeros((6, 0), tf.uint16))
    assert_faithful(cc, name, src)


def test_a_variable_shape_with_a_static_zero_dimension_round_trips(cc, name) -> None:
    # flattened inside TF, a (0, None) tensor has the static shape (0,): batches stay dense
    src = tf.data.Dataset.range(4).map(
        lambda i: (tf.zeros((0, tf.cast(i, tf.int32)), tf.bool), tf.range(i))
    )
    src = src.map(lambda a, b: (tf.ensure_shape(a, (0, None)), b))
    assert_faithful(cc, name, src)


def test_dimensions_that_vary_per_element_round_trip(cc, name) -> None:
    def element(i: tf.Tensor) -> Any:
        n = tf.cast(i, tf.int32)
        return {
            "vector": tf.range(n, dtype=tf.int64),
            "rows": tf.reshape(tf.range(n * 4, dtype=tf.float32), (n, 4)),
            "cols": tf.reshape(tf.range(2 * n, dtype=tf.float64), (2, n)),
            "text": tf.strings.as_string(tf.range(n)),
        }

    src = tf.data.Dataset.range(5).map(element)
    assert src.element_spec["rows"].shape.as_list() == [None, 4]
    assert src.element_spec["cols"].shape.as_list() == [2, None]
    assert_faithful(cc, name, src)


def test_elements_of_unknown_rank_round_trip(cc, name) -> None:
    rng = rng_for("rank")
    shapes = [(), (3,), (2, 0), (1, 2, 3), (0,), (2, 1, 1, 2)]
    elements = [(values("float32", s, rng), values("string", s, rng)) for s in shapes]
    spec = (tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.string))
    src = generated(elements, spec)
    assert src.element_spec[0].shape.rank is None
    assert_faithful(cc, name, src)


# --------------------------------------------------------------------------- cardinality


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.data.Dataset.range(0),
        lambda: tf.data.Dataset.range(0).map(
            lambda i: {"s": tf.strings.as_string(i), "v": tf.range(i)}
        ),
        lambda: tf.data.Dataset.range(0).map(
            lambda i: tf.RaggedTensor.from_row_lengths(tf.range(i), [i])
        ),
        lambda: tf.data.Dataset.range(5).filter(lambda i: i > 10),
    ],
    ids=["range", "variable", "ragged", "filtered-out"],
)
def test_a_dataset_of_zero_elements_caches_as_zero_elements(cc, name, make) -> None:
    src = make()
    assert assert_faithful(cc, name, src) == []
    assert cc.info(name).num_elements == 0


def test_unknown_cardinality_is_unknown_until_the_cache_is_ready(cc, name) -> None:
    src = tf.data.Dataset.range(12).filter(lambda i: i % 3 != 0).map(lambda i: (i, tf.range(i % 4)))
    assert int(src.cache().cardinality()) == UNKNOWN
    ds = cc.cache(src, name=name)
    assert int(ds.cardinality()) == UNKNOWN
    want = elements_of(src)
    assert elements_of(ds) == want and len(want) == 8
    assert int(ds.cardinality()) == UNKNOWN  # an existing dataset keeps its graph
    assert int(cc.cache(src, name=name).cardinality()) == 8
    assert int(cc.dataset(name).cardinality()) == 8
    assert_faithful(cc, f"{name}-2", src)


def test_a_cached_dataset_can_be_repeated_and_batched_like_ds_cache(cc, name) -> None:
    src = tf.data.Dataset.range(5).map(lambda i: (tf.range(i), tf.strings.as_string(i)))
    want = elements_of(src.cache().repeat(2).padded_batch(3))
    assert elements_of(cc.cache(src, name=name).repeat(2).padded_batch(3)) == want
    assert elements_of(cc.dataset(name).repeat(2).padded_batch(3)) == want


# --------------------------------------------------------------------------- fingerprints


def test_a_pipeline_of_several_functions_gets_one_fingerprint(cc, name) -> None:
    """tf.data's DatasetFingerprint op answers differently from call to call here."""
    from client.tf import graphs

    def build() -> tf.data.Dataset:
        return (
            tf.data.Dataset.range(6)
            .map(lambda i: i + 1)
            .filter(lambda i: i > 2)
            .map(tf.strings.as_string)
        )

    src = build()
    prints = {graphs.fingerprint_of(src, None) for _ in range(40)}
    prints |= {graphs.fingerprint_of(build(), None) for _ in range(5)}
    assert len(prints) == 1
    gen = generated([np.int32(1), np.int32(2)], tf.TensorSpec((), tf.int32))
    assert len({graphs.fingerprint_of(gen, None) for _ in range(40)}) == 1
    assert_faithful(cc, name, src)


def test_pipelines_differing_inside_one_of_several_functions_are_told_apart(cc, name) -> None:
    """Serving one's cache for the other would hand out wrong elements."""
    from client import FingerprintMismatchError

    def build(scale: int) -> tf.data.Dataset:
        return (
            tf.data.Dataset.range(6)
            .map(lambda i: i * scale)
            .filter(lambda i: i >= 0)
            .map(tf.strings.as_string)
        )

    assert elements_of(cc.cache(build(2), name=name)) == elements_of(build(2))
    for _ in range(5):
        with pytest.raises(FingerprintMismatchError):
            cc.cache(build(3), name=name)
