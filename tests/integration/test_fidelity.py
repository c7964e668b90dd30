"""Fidelity: what comes out of the cache is exactly what went in.

For every element structure, ``cc.cache(src)`` (epoch 1 writing through, epoch 2
reading back), a second ``cc.cache(src)`` on the READY cache and
``cc.dataset(name)`` must give the elements of ``src`` and of ``src.cache()``
bit for bit, with ``src.element_spec`` and ``src.cache()``'s cardinality.
Elements are compared through :func:`canon`, a JSON-able description that keeps
dtypes, shapes, raw bytes (so NaN payloads and signed zeros count), strings as
bytes, composite tensors' components and namedtuple names and fields.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "string"]
STRINGS = [b"", b"\x00\xff", b"\x00", b"a\x00", b"\x00\x00b", bytes(range(256)), b"\xff" * 3,
           "\u00e9t\u00e9".encode(), b"plain"]

Point = collections.namedtuple("Point", ["x", "label"])
Pair = collections.namedtuple("Pair", ["left", "right"])


# --------------------------------------------------------------------------- canonical forms


def canon(x: Any) -> Any:
    """A JSON-able, exact description of an element (or of a nested structure of them)."""
    if isinstance(x, dict):
        return {"dict": {str(k): canon(v) for k, v in sorted(x.items())}}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {"namedtuple": type(x).__name__, "fields": list(x._fields),
                "values": [canon(v) for v in x]}
    if isinstance(x, (tuple, list)):
        return {"tuple": [canon(v) for v in x]}
    if isinstance(x, tf.RaggedTensor):
        return {"ragged": [canon(s) for s in x.nested_row_splits],
                "flat_values": canon(x.flat_values)}
    if isinstance(x, tf.SparseTensor):
        return {"sparse": [canon(x.indices), canon(x.values), canon(x.dense_shape)]}
    if isinstance(x, tf.TypeSpec):
        return {"spec": repr(x)}
    t = tf.convert_to_tensor(x)
    arr = t.numpy()
    if t.dtype == tf.string:
        data: Any = [b.hex() for b in np.asarray(arr, object).reshape(-1).tolist()]
    else:
        data = np.ascontiguousarray(arr).tobytes().hex()
    return {"dtype": t.dtype.name, "shape": t.shape.as_list(), "data": data}


def elements_of(ds: tf.data.Dataset) -> list[Any]:
    return [canon(e) for e in ds]


def assert_faithful(cc: Any, name: str, src: tf.data.Dataset,
                    runs: list[int] | None = None) -> list[Any]:
    """The cache of src behaves as src.cache(), through every way of reading it.

    runs, when given, counts how often src's Python source ran: epoch 2 and
    every read after it must not run it again.
    """
    want = elements_of(src)
    assert elements_of(src.cache()) == want, "src.cache() itself is not faithful"
    want_cardinality = int(src.cache().cardinality())
    spec = src.element_spec

    ds = cc.cache(src, name=name)
    assert ds.element_spec == spec
    assert canon(ds.element_spec) == canon(spec)
    assert int(ds.cardinality()) == want_cardinality
    assert elements_of(ds) == want, "epoch 1 (write-through) differs from the source"
    info = cc.info(name)
    assert (info.state, info.num_elements) == ("READY", len(want))
    source_runs = list(runs) if runs is not None else None
    assert elements_of(ds) == want, "epoch 2 (read back) differs from the source"

    again = cc.cache(src, name=name)
    assert again.element_spec == spec
    assert int(again.cardinality()) == len(want)
    assert elements_of(again) == want

    back = cc.dataset(name)
    assert back.element_spec == spec
    assert canon(back.element_spec) == canon(spec)
    assert int(back.cardinality()) == len(want)
    assert elements_of(back) == want
    if runs is not None:
        assert runs == source_runs, "a read of the READY cache ran the source pipeline"
    return want


def generated(elements: list[Any], spec: Any, *, known_cardinality: bool = True,
              runs: list[int] | None = None) -> tf.data.Dataset:
    """A from_generator pipeline over elements (numpy values or composite tensors)."""
    def gen() -> Iterator[Any]:
        if runs is not None:
            runs[0] += 1
        yield from elements

    ds = tf.data.Dataset.from_generator(gen, output_signature=spec)
    if known_cardinality:
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(elements)))
    return ds


# --------------------------------------------------------------------------- values


def np_dtype(dtype: str) -> np.dtype:
    if dtype == "string":
        return np.dtype(object)
    if dtype == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def values(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Arbitrary values: any bit pattern for numbers (NaN payloads, -0.0, inf, subnormals)."""
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == "string":
        arr = np.empty(count, object)
        arr[:] = [STRINGS[i] for i in rng.integers(0, len(STRINGS), count)]
        return arr.reshape(shape)
    if dtype == "bool":
        return (rng.integers(0, 2, count) == 1).reshape(shape)
    dt = np_dtype(dtype)
    arr = np.frombuffer(rng.bytes(count * dt.itemsize), dt).copy()
    if dt.kind in "fc" or dtype == "bfloat16":
        specials = np.array([np.nan, -0.0, np.inf, -np.inf]).astype(dt)
        arr[:min(count, 4)] = specials[:min(count, 4)]
    return arr.reshape(shape)


def rng_for(key: str) -> np.random.Generator:
    return np.random.default_rng(sum(key.encode()) * 7919 + len(key))


# --------------------------------------------------------------------------- every dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_shape_elements_of_every_dtype_round_trip_exactly(cc, name, dtype) -> None:
    """Scalars and fixed shapes, sliced from tensors: the batched write path."""
    rng = rng_for(dtype)
    src = tf.data.Dataset.from_tensor_slices({
        "scalar": values(dtype, (7,), rng),
        "matrix": values(dtype, (7, 2, 3), rng),
    })
    assert_faithful(cc, name, src)


@pytest.mark.parametrize("dtype", DTYPES)
def test_variable_shape_elements_of_every_dtype_round_trip_exactly(cc, name, dtype) -> None:
    """Unknown dimensions that change from element to element, unknown rank, empties."""
    rng = rng_for(dtype + "var")
    spec = (tf.TensorSpec((), tf.as_dtype(dtype)),
            tf.TensorSpec((None,), tf.as_dtype(dtype)),
            tf.TensorSpec((None, 4), tf.as_dtype(dtype)),
            tf.TensorSpec((2, None), tf.as_dtype(dtype)),
            tf.TensorSpec(None, tf.as_dtype(dtype)),
            tf.TensorSpec((0,), tf.as_dtype(dtype)))
    shapes = [(3, 0, 1, (2, 2)), (0, 2, 0, ()), (5, 1, 3, (1, 0, 2)), (1, 3, 2, (4,))]
    elements = [
        (values(dtype, (), rng), values(dtype, (a,), rng), values(dtype, (b, 4), rng),
         values(dtype, (2, c), rng), values(dtype, d, rng), values(dtype, (0,), rng))
        for a, b, c, d in shapes
    ]
    runs = [0]
    assert_faithful(cc, name, generated(elements, spec, runs=runs), runs)


def test_bfloat16_elements_round_trip_exactly(cc, name) -> None:
    bits = np.array([0x7FC0, 0x7FC1, 0xFFC0, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x3F80],
                    np.uint16)
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
        lambda i: (i, tf.cast(i, tf.float32) / 3, tf.strings.as_string(i), i > 2))
    assert_faithful(cc, name, src)


def test_empty_tensors_round_trip_with_their_shapes(cc, name) -> None:
    src = tf.data.Dataset.range(4).map(lambda i: {
        "empty": tf.zeros((0,), tf.float32),
        "rows": tf.zeros((3, 0), tf.int64),
        "strings": tf.fill((0, 2), "x"),
        "value": i,
    })
    assert_faithful(cc, name, src)


def test_an_element_of_only_zero_size_components_round_trips(cc, name) -> None:
    src = tf.data.Dataset.range(5).map(
        lambda i: (tf.zeros((0,), tf.float32), tf.zeros((3, 0), tf.string),
                   tf.zeros((0, 0, 2), tf.bool)))
    assert_faithful(cc, name, src)


def test_a_single_zero_size_component_round_trips(cc, name) -> None:
    src = tf.data.Dataset.from_tensor_slices(tf.zeros((6, 0), tf.uint16))
    assert_faithful(cc, name, src)


def test_a_variable_shape_with_a_static_zero_dimension_round_trips(cc, name) -> None:
    # flattened inside TF, a (0, None) tensor has the static shape (0,): batches stay dense
    src = tf.data.Dataset.range(4).map(
        lambda i: (tf.zeros((0, tf.cast(i, tf.int32)), tf.bool), tf.range(i)))
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


# --------------------------------------------------------------------------- structures


def test_nested_dicts_tuples_and_namedtuples_round_trip_with_field_names(cc, name) -> None:
    def element(i: tf.Tensor) -> Any:
        return Point(
            x={"a": i, "b": (tf.cast(i, tf.float16), tf.fill((i,), "s"))},
            label=Pair(left=tf.strings.as_string(i), right=(i * 2, {"z": tf.zeros((2,))})),
        )

    src = tf.data.Dataset.range(4).map(element)
    assert_faithful(cc, name, src)
    spec = cc.dataset(name).element_spec
    assert type(spec).__name__ == "Point" and spec._fields == ("x", "label")
    assert type(spec.label).__name__ == "Pair" and spec.label._fields == ("left", "right")
    first = next(iter(cc.dataset(name)))
    assert first._fields == ("x", "label") and int(first.x["a"]) == 0


def test_a_fixed_shape_namedtuple_keeps_its_type_through_the_batched_path(cc, name) -> None:
    src = tf.data.Dataset.from_tensor_slices(
        Point(x=np.arange(6, dtype=np.float32).reshape(3, 2), label=np.int64([7, 8, 9])))
    assert_faithful(cc, name, src)
    first = next(iter(cc.cache(src, name=name)))
    assert isinstance(first, Point)


def test_ragged_tensors_of_ragged_rank_one_round_trip_with_empty_rows(cc, name) -> None:
    rt = tf.ragged.constant([[[1, 2], []], [[]], [], [[3], [4, 5, 6], []]], dtype=tf.int32,
                            ragged_rank=2)
    src = tf.data.Dataset.from_tensor_slices(rt)
    assert src.element_spec.ragged_rank == 1
    assert_faithful(cc, name, src)


def test_ragged_tensors_of_ragged_rank_two_round_trip(cc, name) -> None:
    rt = tf.ragged.constant([[[["a"], []], [["b", "\x00"]]], [[]], [], [[[], ["", "c"]]]],
                            dtype=tf.string, ragged_rank=3)
    src = tf.data.Dataset.from_tensor_slices(rt)
    assert src.element_spec.ragged_rank == 2
    assert_faithful(cc, name, src)


def test_ragged_tensors_with_a_uniform_inner_dimension_round_trip(cc, name) -> None:
    spec = tf.RaggedTensorSpec((None, None, 2), tf.float32, 1, tf.int32)

    def rows(lengths: list[int]) -> tf.RaggedTensor:
        flat = tf.reshape(tf.range(sum(lengths) * 2, dtype=tf.float32), (-1, 2))
        return tf.RaggedTensor.from_row_lengths(flat, tf.constant(lengths, tf.int32))

    elements = [rows([1, 0, 2]), rows([]), rows([0]), rows([3])]
    assert_faithful(cc, name, generated(elements, spec))


def test_ragged_batches_round_trip(cc, name) -> None:
    src = tf.data.Dataset.range(7).map(lambda i: tf.range(i)).ragged_batch(3)
    assert isinstance(src.element_spec, tf.RaggedTensorSpec)
    assert_faithful(cc, name, src)


def test_sparse_tensors_round_trip_including_ones_without_values(cc, name) -> None:
    sp = tf.sparse.SparseTensor([[0, 0, 1], [2, 1, 0], [2, 1, 3]], [1.5, -0.0, np.nan],
                                [4, 2, 4])
    src = tf.data.Dataset.from_tensor_slices(sp)
    assert src.element_spec.shape.as_list() == [2, 4]
    assert_faithful(cc, name, src)


def test_sparse_tensors_of_varying_dense_shape_round_trip(cc, name) -> None:
    elements = [
        tf.sparse.SparseTensor(tf.zeros((0, 2), tf.int64), tf.zeros((0,), tf.string), [0, 3]),
        tf.sparse.SparseTensor([[0, 1], [4, 0]], tf.constant([b"\x00\xff", b""]), [5, 2]),
        tf.sparse.SparseTensor(tf.zeros((0, 2), tf.int64), tf.zeros((0,), tf.string), [2, 2]),
    ]
    spec = tf.SparseTensorSpec((None, None), tf.string)
    assert_faithful(cc, name, generated(elements, spec))


def test_sparse_tensors_of_unknown_rank_round_trip(cc, name) -> None:
    elements = [
        tf.sparse.SparseTensor([[1]], [7], [3]),
        tf.sparse.SparseTensor(tf.zeros((0, 3), tf.int64), tf.zeros((0,), tf.int32), [2, 0, 4]),
        tf.sparse.SparseTensor([[0, 1], [1, 1]], [1, 2], [2, 2]),
        tf.sparse.SparseTensor(tf.zeros((0, 0), tf.int64), tf.zeros((0,), tf.int32),
                               tf.zeros((0,), tf.int64)),
    ]
    spec = tf.SparseTensorSpec(None, tf.int32)
    assert_faithful(cc, name, generated(elements, spec))


def test_ragged_batches_with_a_known_number_of_rows_round_trip(cc, name) -> None:
    src = tf.data.Dataset.range(9).map(lambda i: tf.range(i % 4)).ragged_batch(
        2, drop_remainder=True)
    assert src.element_spec.shape.as_list() == [2, None]
    assert_faithful(cc, name, src)


def test_variable_components_that_are_empty_in_every_element_round_trip(cc, name) -> None:
    src = tf.data.Dataset.range(5).map(lambda i: (
        tf.range(i * 0),
        tf.reshape(tf.zeros((0,), tf.string), tf.stack([i * 0, 3])),
        tf.reshape(tf.zeros((0,), tf.float16), tf.zeros((i % 3 + 1,), tf.int32)),
        tf.RaggedTensor.from_row_lengths(tf.zeros((0,), tf.uint8), tf.zeros((i,), tf.int64)),
    ))
    assert src.element_spec[2].shape.rank is None
    assert_faithful(cc, name, src)


def test_tensor_spec_names_are_kept(cc, name) -> None:
    spec = {"image": tf.TensorSpec((2,), tf.uint8, name="image"),
            "tokens": tf.TensorSpec((None,), tf.int32, name="tokens")}
    elements = [{"image": np.uint8([i, 255 - i]), "tokens": np.arange(i, dtype=np.int32)}
                for i in range(4)]
    src = generated(elements, spec)
    assert src.element_spec["image"].name == "image"
    assert_faithful(cc, name, src)
    fixed = generated([e["image"] for e in elements], spec["image"])
    assert_faithful(cc, f"{name}-fixed", fixed)


def test_composites_and_dense_tensors_mix_in_one_element(cc, name) -> None:
    def element(i: tf.Tensor) -> Any:
        return {
            "ragged": tf.RaggedTensor.from_row_lengths(tf.range(i * 2), [i, i]),
            "sparse": tf.sparse.from_dense(tf.reshape(tf.range(4) * tf.cast(i % 2, tf.int32),
                                                      (2, 2))),
            "dense": Pair(left=tf.cast(i, tf.bfloat16), right=tf.zeros((0, 3))),
        }

    src = tf.data.Dataset.range(4).map(element)
    assert_faithful(cc, name, src)


def test_elements_spanning_many_write_batches_and_read_chunks_round_trip(cc, name) -> None:
    """About 2.5 MB in 1 MiB read chunks; the variable path writes 64 elements a batch."""
    def element(i: tf.Tensor) -> Any:
        n = tf.cast(i % 97, tf.int32) * 17
        return {"id": i, "ragged_bytes": tf.strings.as_string(tf.range(n)),
                "noise": tf.random.stateless_uniform((n, 3), seed=tf.stack([i, 7]))}

    src = tf.data.Dataset.range(600).map(element)
    assert_faithful(cc, name, src)
    assert cc.info(name).raw_bytes > 2 << 20


def test_many_fixed_shape_elements_round_trip_in_order(cc, name) -> None:
    """More than one 4096-element write batch on the batched path (compared in bulk)."""
    src = tf.data.Dataset.range(4500).map(
        lambda i: (i, tf.cast(tf.fill((3,), i), tf.float16)))

    def everything(ds: tf.data.Dataset) -> Any:
        (whole,) = elements_of(ds.batch(10_000))
        return whole

    want = everything(src)
    ds = cc.cache(src, name=name)
    assert ds.element_spec == src.element_spec and int(ds.cardinality()) == 4500
    assert everything(ds) == want  # epoch 1
    assert cc.info(name).num_elements == 4500
    assert everything(ds) == want  # epoch 2
    back = cc.dataset(name)
    assert back.element_spec == src.element_spec and int(back.cardinality()) == 4500
    assert everything(back) == want


# --------------------------------------------------------------------------- cardinality


@pytest.mark.parametrize("make", [
    lambda: tf.data.Dataset.range(0),
    lambda: tf.data.Dataset.range(0).map(lambda i: {"s": tf.strings.as_string(i),
                                                    "v": tf.range(i)}),
    lambda: tf.data.Dataset.range(0).map(lambda i: tf.RaggedTensor.from_row_lengths(
        tf.range(i), [i])),
    lambda: tf.data.Dataset.range(5).filter(lambda i: i > 10),
], ids=["range", "variable", "ragged", "filtered-out"])
def test_a_dataset_of_zero_elements_caches_as_zero_elements(cc, name, make) -> None:
    src = make()
    assert assert_faithful(cc, name, src) == []
    assert cc.info(name).num_elements == 0


def test_unknown_cardinality_is_unknown_until_the_cache_is_ready(cc, name) -> None:
    src = tf.data.Dataset.range(12).filter(lambda i: i % 3 != 0).map(
        lambda i: (i, tf.range(i % 4)))
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


# --------------------------------------------------------------------------- random structures


@st.composite
def structures(draw: st.DrawFn) -> tuple[Any, Callable[[np.random.Generator], Any]]:
    """A random nested spec and a function drawing one element for it."""
    def leaf() -> tuple[Any, Callable[[np.random.Generator], Any]]:
        dtype = draw(st.sampled_from(DTYPES))
        dims = draw(st.lists(st.integers(0, 3), max_size=3))
        kind = draw(st.sampled_from(["fixed", "unknown dims", "unknown rank"]))
        if kind == "unknown rank":
            spec_shape: Any = None
        elif kind == "unknown dims":
            spec_shape = [None if draw(st.booleans()) else d for d in dims]
        else:
            spec_shape = dims

        def make(rng: np.random.Generator) -> np.ndarray:
            if spec_shape is None:
                shape = tuple(rng.integers(0, 3, rng.integers(0, 4)).tolist())
            else:
                shape = tuple(int(rng.integers(0, 4)) if d is None else d for d in spec_shape)
            return values(dtype, shape, rng)

        return tf.TensorSpec(spec_shape, tf.as_dtype(dtype)), make

    def node(depth: int) -> tuple[Any, Callable[[np.random.Generator], Any]]:
        kind = draw(st.sampled_from(["leaf", "leaf", "tuple", "dict", "namedtuple"])
                    if depth < 2 else st.just("leaf"))
        if kind == "leaf":
            return leaf()
        n = draw(st.integers(1, 3))
        children = [node(depth + 1) for _ in range(n)]
        if kind == "dict":
            keys = draw(st.lists(st.text("abcxyz", min_size=1, max_size=3), min_size=n,
                                 max_size=n, unique=True))
            return ({k: s for k, (s, _) in zip(keys, children)},
                    lambda rng: {k: m(rng) for k, (_, m) in zip(keys, children)})
        if kind == "namedtuple":
            cls = collections.namedtuple(f"Random{n}", [f"f{i}" for i in range(n)])
            return (cls(*(s for s, _ in children)),
                    lambda rng: cls(*(m(rng) for _, m in children)))
        return (tuple(s for s, _ in children), lambda rng: tuple(m(rng) for _, m in children))

    return node(0)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(structure=structures(), count=st.integers(0, 4), known=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_random_nested_structures_round_trip_exactly(cc, name, structure, count, known,
                                                     seed) -> None:
    spec, make = structure
    rng = np.random.default_rng(seed)
    elements = [make(rng) for _ in range(count)]
    src = generated(elements, spec, known_cardinality=known)
    assert_faithful(cc, f"{name}-{uuid.uuid4().hex[:8]}", src)


# --------------------------------------------------------------------------- another process


def rich_source() -> tf.data.Dataset:
    """Namedtuples, dicts, ragged, sparse, bfloat16, uint32 and NUL bytes, through
    several tf.data functions; the subprocess below builds it the same way."""
    def element(i: tf.Tensor) -> Any:
        return Point(
            x={"ragged": tf.RaggedTensor.from_row_lengths(tf.range(i * 2), [i, i]),
               "half": tf.fill((2,), tf.cast(i, tf.bfloat16) / 3),
               "vec": tf.cast(tf.range(i), tf.uint32)},
            label=Pair(left=tf.strings.join([tf.strings.as_string(i), "\x00\xff"]),
                       right=tf.sparse.from_dense(
                           tf.reshape(tf.range(4) * tf.cast(i % 2, tf.int32), (2, 2)))),
        )

    def double_vec(p: Point) -> Point:
        return p._replace(x={**p.x, "vec": p.x["vec"] * 2})

    return tf.data.Dataset.range(7).filter(lambda i: i < 5).map(element).map(double_vec)


READER = textwrap.dedent("""
    import importlib.util, json, sys
    sys.path.insert(0, sys.argv[1])
    spec = importlib.util.spec_from_file_location("fidelity", sys.argv[2])
    fidelity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fidelity)
    from client import CacheClient

    with CacheClient(sys.argv[3]) as cc:
        ds = cc.dataset(sys.argv[4])
        again = cc.cache(fidelity.rich_source(), name=sys.argv[4])
        print(json.dumps({"spec": fidelity.canon(ds.element_spec),
                          "cardinality": int(ds.cardinality()),
                          "elements": fidelity.elements_of(ds),
                          "again_cardinality": int(again.cardinality()),
                          "again": fidelity.elements_of(again)}))
""")


def test_another_process_reads_the_same_elements_and_spec(cc, daemon, name, tmp_path) -> None:
    src = rich_source()
    want = assert_faithful(cc, name, src)
    assert len(want) == 5
    script = tmp_path / "read.py"
    script.write_text(READER)
    result = subprocess.run(
        [sys.executable, str(script), str(ROOT), __file__, daemon.unix_target, name],
        capture_output=True, timeout=240, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    got = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert got["elements"] == want
    assert got["cardinality"] == 5
    assert got["spec"] == canon(src.element_spec)
    assert got["spec"]["namedtuple"] == "Point" and got["spec"]["fields"] == ["x", "label"]
    assert got["spec"]["values"][1]["namedtuple"] == "Pair"
    # the same pipeline built there is recognised (no FingerprintMismatchError)
    assert got["again"] == want and got["again_cardinality"] == 5


# --------------------------------------------------------------------------- fingerprints


def test_a_pipeline_of_several_functions_gets_one_fingerprint(cc, name) -> None:
    """tf.data's DatasetFingerprint op answers differently from call to call here."""
    from client.tf import graphs

    def build() -> tf.data.Dataset:
        return (tf.data.Dataset.range(6).map(lambda i: i + 1).filter(lambda i: i > 2)
                .map(tf.strings.as_string))

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
        return (tf.data.Dataset.range(6).map(lambda i: i * scale).filter(lambda i: i >= 0)
                .map(tf.strings.as_string))

    assert elements_of(cc.cache(build(2), name=name)) == elements_of(build(2))
    for _ in range(5):
        with pytest.raises(FingerprintMismatchError):
            cc.cache(build(3), name=name)
