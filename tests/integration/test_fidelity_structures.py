"""Fidelity of structures: nested, named, ragged, sparse and random specs round-trip exactly,
and another process reads the same elements and spec (tests/fidelity.py: ``assert_faithful``)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

from fidelity import (  # noqa: E402
    DTYPES,
    Pair,
    Point,
    assert_faithful,
    canon,
    elements_of,
    generated,
    rich_source,
    values,
)

ROOT = Path(__file__).resolve().parents[2]


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
        Point(x=np.arange(6, dtype=np.float32).reshape(3, 2), label=np.int64([7, 8, 9]))
    )
    assert_faithful(cc, name, src)
    first = next(iter(cc.cache(src, name=name)))
    assert isinstance(first, Point)


def test_ragged_tensors_of_ragged_rank_zero_round_trip_with_their_spec(cc, name) -> None:
    """Rows sliced from a ragged_rank 1 tensor: a RaggedTensorSpec of ragged_rank 0, whose
    values are dense and which tf.data carries as a variant."""
    src = tf.data.Dataset.from_tensor_slices(
        {"r": tf.ragged.constant([[1, 2], [], [3]]), "x": [1.0, 2.0, 3.0]}
    )
    assert src.element_spec["r"].ragged_rank == 0
    assert_faithful(cc, name, src)


def test_ragged_tensors_of_ragged_rank_one_round_trip_with_empty_rows(cc, name) -> None:
    rt = tf.ragged.constant(
        [[[1, 2], []], [[]], [], [[3], [4, 5, 6], []]], dtype=tf.int32, ragged_rank=2
    )
    src = tf.data.Dataset.from_tensor_slices(rt)
    assert src.element_spec.ragged_rank == 1
    assert_faithful(cc, name, src)


def test_ragged_tensors_of_ragged_rank_two_round_trip(cc, name) -> None:
    rt = tf.ragged.constant(
        [[[["a"], []], [["b", "\x00"]]], [[]], [], [[[], ["", "c"]]]],
        dtype=tf.string,
        ragged_rank=3,
    )
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
    sp = tf.sparse.SparseTensor([[0, 0, 1], [2, 1, 0], [2, 1, 3]], [1.5, -0.0, np.nan], [4, 2, 4])
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
        tf.sparse.SparseTensor(
            tf.zeros((0, 0), tf.int64), tf.zeros((0,), tf.int32), tf.zeros((0,), tf.int64)
        ),
    ]
    spec = tf.SparseTensorSpec(None, tf.int32)
    assert_faithful(cc, name, generated(elements, spec))


def test_ragged_batches_with_a_known_number_of_rows_round_trip(cc, name) -> None:
    src = (
        tf.data.Dataset.range(9).map(lambda i: tf.range(i % 4)).ragged_batch(2, drop_remainder=True)
    )
    assert src.element_spec.shape.as_list() == [2, None]
    assert_faithful(cc, name, src)


def test_variable_components_that_are_empty_in_every_element_round_trip(cc, name) -> None:
    src = tf.data.Dataset.range(5).map(
        lambda i: (
            tf.range(i * 0),
            tf.reshape(tf.zeros((0,), tf.string), tf.stack([i * 0, 3])),
            tf.reshape(tf.zeros((0,), tf.float16), tf.zeros((i % 3 + 1,), tf.int32)),
            tf.RaggedTensor.from_row_lengths(tf.zeros((0,), tf.uint8), tf.zeros((i,), tf.int64)),
        )
    )
    assert src.element_spec[2].shape.rank is None
    assert_faithful(cc, name, src)


def test_tensor_spec_names_are_kept(cc, name) -> None:
    spec = {
        "image": tf.TensorSpec((2,), tf.uint8, name="image"),
        "tokens": tf.TensorSpec((None,), tf.int32, name="tokens"),
    }
    elements = [
        {"image": np.uint8([i, 255 - i]), "tokens": np.arange(i, dtype=np.int32)} for i in range(4)
    ]
    src = generated(elements, spec)
    assert src.element_spec["image"].name == "image"
    assert_faithful(cc, name, src)
    fixed = generated([e["image"] for e in elements], spec["image"])
    assert_faithful(cc, f"{name}-fixed", fixed)


def test_composites_and_dense_tensors_mix_in_one_element(cc, name) -> None:
    def element(i: tf.Tensor) -> Any:
        return {
            "ragged": tf.RaggedTensor.from_row_lengths(tf.range(i * 2), [i, i]),
            "sparse": tf.sparse.from_dense(
                tf.reshape(tf.range(4) * tf.cast(i % 2, tf.int32), (2, 2))
            ),
            "dense": Pair(left=tf.cast(i, tf.bfloat16), right=tf.zeros((0, 3))),
        }

    src = tf.data.Dataset.range(4).map(element)
    assert_faithful(cc, name, src)


def test_elements_spanning_many_write_batches_and_read_chunks_round_trip(cc, name) -> None:
    """About 2.5 MB in 1 MiB read chunks; the variable path writes 64 elements a batch."""

    def element(i: tf.Tensor) -> Any:
        n = tf.cast(i % 97, tf.int32) * 17
        return {
            "id": i,
            "ragged_bytes": tf.strings.as_string(tf.range(n)),
            "noise": tf.random.stateless_uniform((n, 3), seed=tf.stack([i, 7])),
        }

    src = tf.data.Dataset.range(600).map(element)
    assert_faithful(cc, name, src)
    assert cc.info(name).raw_bytes > 2 << 20


def test_many_fixed_shape_elements_round_trip_in_order(cc, name) -> None:
    """More than one 4096-element write batch on the batched path (compared in bulk)."""
    src = tf.data.Dataset.range(4500).map(lambda i: (i, tf.cast(tf.fill((3,), i), tf.float16)))

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
        kind = draw(
            st.sampled_from(["leaf", "leaf", "tuple", "dict", "namedtuple"])
            if depth < 2
            else st.just("leaf")
        )
        if kind == "leaf":
            return leaf()
        n = draw(st.integers(1, 3))
        children = [node(depth + 1) for _ in range(n)]
        if kind == "dict":
            keys = draw(
                st.lists(
                    st.text("abcxyz", min_size=1, max_size=3), min_size=n, max_size=n, unique=True
                )
            )
            return (
                {k: s for k, (s, _) in zip(keys, children)},
                lambda rng: {k: m(rng) for k, (_, m) in zip(keys, children)},
            )
        if kind == "namedtuple":
            cls = collections.namedtuple(f"Random{n}", [f"f{i}" for i in range(n)])
            return (cls(*(s for s, _ in children)), lambda rng: cls(*(m(rng) for _, m in children)))
        return (tuple(s for s, _ in children), lambda rng: tuple(m(rng) for _, m in children))

    return node(0)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    structure=structures(),
    count=st.integers(0, 4),
    known=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_nested_structures_round_trip_exactly(
    cc, name, structure, count, known, seed
) -> None:
    spec, make = structure
    rng = np.random.default_rng(seed)
    elements = [make(rng) for _ in range(count)]
    src = generated(elements, spec, known_cardinality=known)
    assert_faithful(cc, f"{name}-{uuid.uuid4().hex[:8]}", src)


# --------------------------------------------------------------------------- another process


READER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [sys.argv[1], sys.argv[2]]  # the checkout, and tests/ for fidelity.py
    import fidelity
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
        [sys.executable, str(script), str(ROOT), str(ROOT / "tests"), daemon.unix_target, name],
        capture_output=True,
        timeout=240,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    got = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert got["elements"] == want
    assert got["cardinality"] == 5
    assert got["spec"] == canon(src.element_spec)
    assert got["spec"]["namedtuple"] == "Point" and got["spec"]["fields"] == ["x", "label"]
    assert got["spec"]["values"][1]["namedtuple"] == "Pair"
    # the same pipeline built there is recognised (no FingerprintMismatchError)
    assert got["again"] == want and got["again_cardinality"] == 5
