"""batch() on a cache's dataset: the batches read as batches, the same as tf.data's batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from client import CacheClient  # noqa: E402
from client.tf.datasets import CachedElements  # noqa: E402

N = 1000  # 4 blocks of 254 ~1 KB elements, the last one short


def source(n: int = N) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(
        lambda i: {
            "x": tf.cast(i, tf.float32) + tf.linspace(0.0, 1.0, 256),
            "pair": (i, tf.cast(i % 7, tf.uint8)),
        }
    )


#: tf.data's own batching: never in a read of the cache's batches
TF_BATCHES = {"BatchDatasetV2", "ParallelBatchDataset", "RebatchDatasetV2"}


def ops_of(ds: tf.data.Dataset) -> set[str]:
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    functions = [node for f in graph.library.function for node in f.node_def]  # flat_map's
    return {node.op for node in [*graph.node, *functions]}


def assert_same_batches(got: tf.data.Dataset, want: tf.data.Dataset) -> None:
    assert got.element_spec == want.element_spec
    assert int(got.cardinality()) == int(want.cardinality())
    pairs = list(zip(got.as_numpy_iterator(), want.as_numpy_iterator(), strict=True))
    assert pairs
    for have, expected in pairs:
        tf.nest.map_structure(np.testing.assert_array_equal, have, expected)


@pytest.mark.parametrize("direct", [False, True])
def test_batches_of_a_cache_equal_tf_datas_for_every_size_and_remainder(
    cc: CacheClient, name: str, direct: bool
) -> None:
    ds = cc.cache(source(), name=name, direct=direct)
    assert isinstance(ds, CachedElements)
    # epoch 1 writes through while batching
    assert_same_batches(ds.batch(100), source().batch(100))
    assert cc._get(name).num_elements == N
    for size in (1, 7, 254, 256, 999, 5000):
        for drop in (False, True):
            if drop and size > N:
                continue
            got = cc.dataset(name, direct=direct).batch(size, drop_remainder=drop)
            assert not TF_BATCHES & ops_of(got)  # small batches are cut from chunks by unbatch
            assert_same_batches(got, source().batch(size, drop_remainder=drop))


def test_batch_arguments_a_read_cannot_take_go_to_tf_datas_batch(
    cc: CacheClient, name: str
) -> None:
    list(cc.cache(source(), name=name))
    tensor_size = cc.dataset(name).batch(tf.constant(64, tf.int64))
    assert "BatchDatasetV2" in ops_of(tensor_size)
    assert_same_batches(tensor_size, source().batch(tf.constant(64, tf.int64)))
    parallel = cc.dataset(name).batch(
        64, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False, name="b"
    )
    assert not TF_BATCHES & ops_of(parallel)  # in order: deterministic=False allows it
    assert_same_batches(parallel, source().batch(64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="greater than zero"):
        cc.dataset(name).batch(0)  # tf.data's own error


def test_shuffled_and_sharded_reads_batch_the_same_elements(cc: CacheClient, name: str) -> None:
    list(cc.cache(source(), name=name))

    def ids(ds: tf.data.Dataset) -> list[int]:
        return [int(i) for b in ds.as_numpy_iterator() for i in b["pair"][0]]

    shuffled = ids(cc.dataset(name, shuffle=True, seed=5).batch(33))
    assert shuffled == [
        int(e["pair"][0]) for e in cc.dataset(name, shuffle=True, seed=5).as_numpy_iterator()
    ]
    assert sorted(shuffled) == list(range(N)) != shuffled
    shares = [ids(cc.dataset(name, worker_index=w, num_workers=3).batch(50)) for w in range(3)]
    assert [i for share in shares for i in share] == list(range(N))


def test_caches_of_variable_shapes_keep_tf_datas_batch(cc: CacheClient, name: str) -> None:
    # shape (None,) in the spec, three items in every element
    runs = tf.data.Dataset.range(40).map(lambda i: (tf.fill([3 + tf.cast(0 * i, tf.int32)], i), i))
    ds: Any = cc.cache(runs, name=name)
    assert type(ds.batch(16)) is type(runs.batch(16)), "tf.data's own batch()"
    assert_same_batches(ds.batch(16), runs.batch(16))
    assert_same_batches(ds.padded_batch(16), runs.padded_batch(16))


def test_write_through_takes_the_sources_batches_without_copying_them() -> None:
    from client.tf.convert import BatchFormat, _view, layout_of, source_batches

    fmt = BatchFormat(source().element_spec, layout_of(source().element_spec))
    n, arrays = next(source_batches(source(), fmt, 64))
    assert n == 64 and all(not a.flags.writeable for a in arrays)  # views of TF's buffers
    assert all(a.ctypes.data % 64 == 0 for a in arrays)  # from_generator aliases them
    tensor = tf.random.uniform((4, 8))
    assert _view(tensor).ctypes.data == _view(tensor).ctypes.data  # numpy() copies each time
    for dtype in (tf.bfloat16, tf.string, tf.bool):  # copied where a view is not possible
        t = tf.cast(tf.constant([[1, 0]]), dtype) if dtype != tf.string else tf.constant([["a"]])
        np.testing.assert_array_equal(_view(t), t.numpy())
