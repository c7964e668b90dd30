"""The tapped write epoch (client/tf/tap.py) and the generator path, side by side.

Fixed-shape dense sources take the tap unless SHARDCACHE_WRITE_TAP=0; the
other write-through tests (test_write_through.py, test_write_behind.py,
test_disk_full.py, test_fidelity.py) run their fixed-shape sources through
the tap and their ragged and sparse ones through the generator path.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from waits import gone, wait_until

tf = pytest.importorskip("tensorflow")

from client import settings  # noqa: E402
from client._transport import Transport, pb  # noqa: E402
from client.format.layout import Layout, Leaf  # noqa: E402
from client.tf.convert import encode_spec  # noqa: E402
from client.write import write_behind  # noqa: E402
from client.write.stream import CacheWriter  # noqa: E402
from client.write.write_behind import WriteBehind  # noqa: E402

PATHS = pytest.mark.parametrize("tap", ["1", "0"], ids=["tap", "generator"])


def graph_ops(ds: tf.data.Dataset) -> set[str]:
    """Every op in the dataset's serialized graph, its functions included."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(
        tf.raw_ops.DatasetToGraphV2(
            input_dataset=ds._variant_tensor, external_state_policy=1
        ).numpy()
    )
    ops = {n.op for n in graph.node}
    for function in graph.library.function:
        ops |= {n.op for n in function.node_def}
    return ops


@pytest.mark.parametrize(("tap", "inside"), [("1", True), ("0", False)], ids=["tap", "generator"])
def test_a_fixed_shape_source_runs_inside_the_cached_datasets_graph_unless_the_tap_is_off(
    cc, name, monkeypatch, tap, inside
) -> None:
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)
    src = tf.data.Dataset.range(10).map(lambda x: tf.bitwise.left_shift(x, 3))
    ds = cc.cache(src, name=name)
    assert ("LeftShift" in graph_ops(ds)) is inside
    assert [int(x) for x in ds] == [x << 3 for x in range(10)]
    assert cc.info(name).num_elements == 10


def test_a_source_of_unknown_cardinality_keeps_the_generator_path(cc, name) -> None:
    """The tap commits only a write of exactly the source's cardinality (a source error
    can end tf.data's batches early), so it needs to know it."""
    src = tf.data.Dataset.range(20).filter(lambda x: x % 2 == 0)
    ds = cc.cache(src, name=name)
    assert "FloorMod" not in graph_ops(ds)  # the source's predicate: not in tf.data
    assert [int(x) for x in ds] == list(range(0, 20, 2))
    assert cc.info(name).num_elements == 10


@pytest.mark.parametrize(("tap", "inside"), [("1", True), ("0", False)], ids=["tap", "generator"])
def test_ragged_sparse_and_variable_shape_sources_are_tapped_too(
    cc, name, monkeypatch, tap, inside
) -> None:
    """Flattened and ragged_batch'ed in tf.data, handed to the tap as their wire form."""
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)

    def element(x: tf.Tensor) -> dict[str, object]:
        return {
            "ragged": tf.ragged.range(x),  # shape (1, None)
            "sparse": tf.sparse.from_dense(tf.reshape(tf.range(x), [1, -1])),
            "var": tf.fill(tf.stack([x % 3, 2]), x),
            "empty": tf.zeros([0, 4]),
        }

    src = tf.data.Dataset.range(6).map(element)
    ds = cc.cache(src, name=name)
    assert ("RaggedRange" in graph_ops(ds)) is inside

    def values(d: dict[str, object]) -> list[object]:
        return [
            d["ragged"].numpy().tolist(),
            tf.sparse.to_dense(d["sparse"]).numpy().tolist(),
            d["var"].numpy().tolist(),
            d["empty"].shape.as_list(),
        ]

    expected = [values(x) for x in src]
    assert [values(x) for x in ds] == expected
    assert cc.info(name).num_elements == 6
    assert [values(x) for x in ds] == expected  # read back


@PATHS
def test_the_cached_dataset_has_the_sources_options_as_ds_cache_has(
    cc, name, monkeypatch, tap
) -> None:
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)
    options = tf.data.Options()
    options.deterministic = False
    options.threading.private_threadpool_size = 3
    src = tf.data.Dataset.range(10).with_options(options)
    for ds in (cc.cache(src, name=name), cc.cache(src, name=name).batch(4)):
        assert ds.options().deterministic is False
        assert ds.options().threading.private_threadpool_size == 3
        # tapped, no policy of its own: a stateful function of the user's fails a save, as
        # with ds.cache() (test_checkpoints.py); the generator path's from_generator needs
        # IGNORE for its read epochs to save (client/tf/iterations.py)
        assert ds.options().experimental_external_state_policy == (
            None if tap == "1" else tf.data.experimental.ExternalStatePolicy.IGNORE
        )
    assert [int(x) for x in cc.cache(src, name=name)] == list(range(10))


@PATHS
def test_a_second_iterator_started_during_the_write_streams_the_source_and_one_write_commits(
    cc, name, monkeypatch, tap, no_thread_leak
) -> None:
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)
    ds = cc.cache(tf.data.Dataset.range(3000).map(lambda x: (tf.fill([16], x), x)), name=name)
    writing = iter(ds)
    first = [int(next(writing)[1]) for _ in range(10)]
    assert cc.info(name).state == "WRITING"
    assert [int(y) for _, y in ds] == list(range(3000)), "the second iterator passes through"
    assert cc.info(name).state == "WRITING"
    rest = [int(y) for _, y in writing]
    assert first + rest == list(range(3000))
    info = cc.info(name)
    assert info.state == "READY" and info.num_elements == 3000
    assert [int(y) for _, y in ds] == list(range(3000))  # read back from the daemon
    del writing


@PATHS
def test_a_source_error_mid_write_reaches_the_caller_and_commits_nothing(
    cc, name, monkeypatch, tap, no_thread_leak
) -> None:
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)

    def check(x: tf.Tensor) -> tf.Tensor:
        bad = tf.debugging.assert_less(x, np.int64(700), message="element 700 is corrupt")
        with tf.control_dependencies([bad]):
            return tf.identity(x)

    ds = cc.cache(tf.data.Dataset.range(1000).map(check), name=name)
    seen = []
    with pytest.raises(tf.errors.OpError, match="element 700 is corrupt") as raised:
        for x in ds:
            seen.append(int(x))
    # the tap keeps the source's own error; from_generator reports any error as UnknownError
    expected = tf.errors.InvalidArgumentError if tap == "1" else tf.errors.UnknownError
    assert type(raised.value) is expected
    assert seen == list(range(len(seen))) and len(seen) <= 700
    # tf.data's prefetch asks again after the error, and the source's batches then end as
    # if complete: the tap has seen fewer elements than the source holds, so the write is
    # discarded rather than committed short (a READY cache of 512 of the 1000 elements,
    # before). Freeing the iterator (its traceback holds it, in a reference cycle) also
    # cancels the write; the generator path's ends at once.
    del raised
    gc.collect()
    wait_until(lambda: gone(cc, name), 20, f"cache {name!r} discarded")
    assert [int(x) for x in ds.take(5)] == [0, 1, 2, 3, 4]  # the source again, unwritten


@PATHS
def test_take_of_fewer_elements_than_the_source_discards_the_write_then_a_full_epoch_commits(
    cc, name, monkeypatch, tap, no_thread_leak
) -> None:
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)
    ds = cc.cache(tf.data.Dataset.range(5000), name=name)
    assert [int(x) for x in ds.take(300)] == list(range(300))
    wait_until(lambda: gone(cc, name), 20, f"cache {name!r} deleted")
    assert [int(x) for x in ds] == list(range(5000))
    assert cc.info(name).num_elements == 5000


@PATHS
@pytest.mark.parametrize("drop", [False, True], ids=["remainder", "drop_remainder"])
def test_batch_in_the_write_epoch_gives_tf_datas_batches_and_writes_every_element(
    cc, name, monkeypatch, tap, drop, no_thread_leak
) -> None:
    """batch() on a writing iteration taps the consumer's own batches (no rebatch copy);
    drop_remainder drops the short last batch only after the tap has written it."""
    monkeypatch.setenv(settings.WRITE_TAP.name, tap)
    src = tf.data.Dataset.range(100).map(lambda x: (tf.fill([3], x), x))
    ds = cc.cache(src, name=name).batch(7, drop_remainder=drop)
    expected = [y.numpy().tolist() for _, y in src.batch(7, drop_remainder=drop)]
    assert ds.element_spec == src.batch(7, drop_remainder=drop).element_spec
    assert int(ds.cardinality()) == len(expected)
    assert [y.numpy().tolist() for _, y in ds] == expected  # the writing epoch
    assert cc.info(name).num_elements == 100, "the dropped remainder is in the cache too"
    assert [y.numpy().tolist() for _, y in ds] == expected  # read back
    assert sorted(int(y) for _, y in cc.dataset(name)) == list(range(100))


class _CountingWriter(CacheWriter):
    """The real CacheWriter, counting the add() calls WriteBehind makes."""

    adds: list[int]

    def add(self, values, raw_bytes, num_elements=None):  # type: ignore[no-untyped-def]
        self.adds.append(len(values))
        super().add(values, raw_bytes, num_elements)


def test_a_batch_larger_than_a_slice_is_packed_and_written_a_slice_at_a_time(
    daemon, cc, name, monkeypatch, no_thread_leak
) -> None:
    """A tapped batch() hands over the consumer's batches (256 images are 154 MB): their
    stored values are made and written SLICE_BYTES at a time, not all before the first."""
    monkeypatch.setattr(write_behind, "SLICE_BYTES", 64 << 10)
    layout = Layout((Leaf("float32", (4096,)), Leaf("int64", ())))  # 16 KiB + 8 per element
    transport = Transport(daemon.unix_target)
    spec = (tf.TensorSpec((4096,), tf.float32), tf.TensorSpec((), tf.int64))
    writer = _CountingWriter(
        transport,
        pb.WriteBegin(
            name=name, fingerprint="f", layout_json=layout.to_json(), element_spec=encode_spec(spec)
        ),
    )
    writer.adds = []
    assert writer.begin().decision == pb.WRITE_DECISION_ACCEPTED
    features = np.arange(40 * 4096, dtype=np.float32).reshape(40, 4096)
    behind = WriteBehind(writer, layout)
    try:
        behind.put(40, [features, np.arange(40, dtype=np.int64)])
        cache = behind.finish()
    finally:
        behind.close()
        transport.close()
    assert cache is not None and cache.num_elements == 40
    assert writer.adds[:-1] == [3] * 13 + [1], writer.adds  # 64 KiB // 16,392 = 3 per slice
    read = cc.dataset(name)
    assert [int(y) for _, y in read] == list(range(40))
    assert all(np.array_equal(x.numpy(), features[i]) for i, (x, _) in enumerate(read))
