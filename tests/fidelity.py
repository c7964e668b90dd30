"""Exact, JSON-able descriptions of tf.data elements, the round-trip check every fidelity
test makes, and the sources those tests build (tests/integration/test_fidelity*.py).

Elements are compared through :func:`canon`, which keeps dtypes, shapes, raw bytes (so NaN
payloads and signed zeros count), strings as bytes, composite tensors' components and
namedtuple names and fields.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import tensorflow as tf

UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)

DTYPES = [
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
]
STRINGS = [
    b"",
    b"\x00\xff",
    b"\x00",
    b"a\x00",
    b"\x00\x00b",
    bytes(range(256)),
    b"\xff" * 3,
    "\u00e9t\u00e9".encode(),
    b"plain",
]

Point = collections.namedtuple("Point", ["x", "label"])
Pair = collections.namedtuple("Pair", ["left", "right"])


# --------------------------------------------------------------------------- canonical forms


def canon(x: Any) -> Any:
    """A JSON-able, exact description of an element (or of a nested structure of them)."""
    if isinstance(x, dict):
        return {"dict": {str(k): canon(v) for k, v in sorted(x.items())}}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {
            "namedtuple": type(x).__name__,
            "fields": list(x._fields),
            "values": [canon(v) for v in x],
        }
    if isinstance(x, (tuple, list)):
        return {"tuple": [canon(v) for v in x]}
    if isinstance(x, tf.RaggedTensor):
        return {
            "ragged": [canon(s) for s in x.nested_row_splits],
            "flat_values": canon(x.flat_values),
        }
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


def assert_faithful(
    cc: Any, name: str, src: tf.data.Dataset, runs: list[int] | None = None
) -> list[Any]:
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


def generated(
    elements: list[Any], spec: Any, *, known_cardinality: bool = True, runs: list[int] | None = None
) -> tf.data.Dataset:
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
        arr[: min(count, 4)] = specials[: min(count, 4)]
    return arr.reshape(shape)


def rng_for(key: str) -> np.random.Generator:
    return np.random.default_rng(sum(key.encode()) * 7919 + len(key))


def rich_source() -> tf.data.Dataset:
    """Namedtuples, dicts, ragged, sparse, bfloat16, uint32 and NUL bytes, through
    several tf.data functions; the subprocess below builds it the same way."""

    def element(i: tf.Tensor) -> Any:
        return Point(
            x={
                "ragged": tf.RaggedTensor.from_row_lengths(tf.range(i * 2), [i, i]),
                "half": tf.fill((2,), tf.cast(i, tf.bfloat16) / 3),
                "vec": tf.cast(tf.range(i), tf.uint32),
            },
            label=Pair(
                left=tf.strings.join([tf.strings.as_string(i), "\x00\xff"]),
                right=tf.sparse.from_dense(
                    tf.reshape(tf.range(4) * tf.cast(i % 2, tf.int32), (2, 2))
                ),
            ),
        )

    def double_vec(p: Point) -> Point:
        return p._replace(x={**p.x, "vec": p.x["vec"] * 2})

    return tf.data.Dataset.range(7).filter(lambda i: i < 5).map(element).map(double_vec)
