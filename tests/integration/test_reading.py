"""Reading at scale against a real daemon: shuffles, worker shares, parallel streams, resume."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from sharded import ids, write_sharded  # noqa: E402

from client import (  # noqa: E402
    CacheClient,
    FingerprintMismatchError,
    InvalidArgumentError,
    ResumeMismatchError,
)
from client._transport import pb  # noqa: E402

N = 1000  # elements of the test cache, in 11 shards of ~90 (uneven on purpose)


def source(n: int = N) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(
        lambda i: {"x": tf.fill([8], tf.cast(i, tf.float32)), "i": i}
    )


@pytest.fixture(scope="module", params=[None, 400], ids=["format1", "blocks"])
def sharded(daemon, request) -> str:
    """One element per value (as earlier versions wrote), or blocks of 10 elements."""
    with CacheClient(daemon.unix_target) as cc:
        cache = write_sharded(
            cc,
            source(),
            f"reading-sharded-{request.param}",
            shard_bytes=3000 if request.param is None else 400,
            chunk_bytes=4096 if request.param is None else 100,
            block_bytes=request.param,
        )
    assert len(cache.shards) > 5
    assert (request.param is None) == ('"format":1' in cache.layout_json)
    return cache.name


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
@pytest.mark.parametrize("num_workers", [1, 3, 7])
def test_each_epoch_visits_every_element_once_across_workers(
    cc, sharded, shuffle, num_workers
) -> None:
    datasets = [
        cc.dataset(sharded, shuffle=shuffle, seed=11, worker_index=w, num_workers=num_workers)
        for w in range(num_workers)
    ]
    orders = []
    for _epoch in range(2):
        shares = [ids(ds) for ds in datasets]
        for ds, share in zip(datasets, shares):
            assert int(ds.cardinality()) == len(share)  # what Keras plans with is what it gets
        everything = [i for share in shares for i in share]
        assert sorted(everything) == list(range(N))
        orders.append(everything)
    if shuffle:
        assert orders[0] != orders[1], "the second epoch repeated the first one's order"
        assert orders[0] != list(range(N))
    else:
        assert orders[0] == orders[1] == list(range(N))


def test_the_same_seed_gives_the_same_order_in_another_dataset(cc, sharded) -> None:
    a = cc.dataset(sharded, shuffle=True, seed=5)
    b = cc.dataset(sharded, shuffle=True, seed=5)
    c = cc.dataset(sharded, shuffle=True, seed=6)
    first = ids(a)
    assert first == ids(b)
    assert first != ids(c)
    assert ids(a) == ids(cc.dataset(sharded, shuffle=True, seed=5, epoch=1))


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
def test_parallel_streams_yield_exactly_the_sequential_order(cc, sharded, shuffle) -> None:
    one = ids(cc.dataset(sharded, shuffle=shuffle, seed=3, prefetch_bytes=64 << 10))
    four = ids(
        cc.dataset(sharded, shuffle=shuffle, seed=3, parallel_shards=4, prefetch_bytes=64 << 10)
    )
    assert four == one


def test_resuming_at_epoch_and_start_yields_the_rest_then_the_next_epoch(cc, sharded) -> None:
    full = cc.dataset(sharded, shuffle=True, seed=9, worker_index=1, num_workers=3, epoch=4)
    epoch4, epoch5 = ids(full), ids(full)
    resumed = cc.dataset(
        sharded, shuffle=True, seed=9, worker_index=1, num_workers=3, epoch=4, start=123
    )
    assert int(resumed.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    assert ids(resumed) == epoch4[123:]
    assert ids(resumed) == epoch5


def test_a_read_state_derived_from_a_step_counter_resumes_exactly(cc, sharded) -> None:
    opts = {"shuffle": "shards", "seed": 2, "worker_index": 0, "num_workers": 2}
    ds = cc.dataset(sharded, **opts)
    seen = ids(ds) + ids(ds)  # epochs 0 and 1 of this worker's 500
    state = cc.read_state(sharded, elements_seen=700, **opts)
    assert (state.epoch, state.start) == (1, 200)
    restored = type(state).from_json(state.to_json())
    assert ids(cc.dataset(sharded, resume=restored, **opts)) == seen[700:]


def test_the_documented_step_counter_recipe_resumes_across_epoch_boundaries(cc, sharded) -> None:
    opts = {"shuffle": True, "seed": 21, "worker_index": 2, "num_workers": 3}  # share: 334
    batch = 64

    def steps(ds: tf.data.Dataset, count: int) -> list[list[int]]:
        return [b["i"].tolist() for b in ds.take(count).as_numpy_iterator()]

    reference = steps(cc.dataset(sharded, **opts).repeat().batch(batch), 20)  # 3.8 epochs
    step = 7  # a job restarted after 7 steps, inside epoch 1
    state = cc.read_state(sharded, elements_seen=step * batch, **opts)
    assert (state.epoch, state.start) == (1, 7 * 64 - 334)
    resumed = cc.dataset(sharded, resume=state, **opts).repeat().batch(batch)
    assert steps(resumed, 13) == reference[step:]


def test_resuming_with_a_state_of_another_seed_or_cache_is_refused(cc, sharded, name) -> None:
    state = cc.read_state(sharded, elements_seen=10, shuffle=True, seed=1)
    with pytest.raises(ResumeMismatchError, match="saved with seed=1"):
        cc.dataset(sharded, shuffle=True, seed=2, resume=state)
    with pytest.raises(ResumeMismatchError, match="saved with shuffle='elements'"):
        cc.dataset(sharded, shuffle="shards", seed=1, resume=state)
    cc.cache(source(20), name=name, version="1")  # another cache
    for _ in cc.cache(source(20), name=name, version="1"):
        pass
    with pytest.raises(ResumeMismatchError, match="saved with cache="):
        cc.dataset(name, shuffle=True, seed=1, resume=state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"worker_index": 2, "num_workers": 2}, "worker_index 2 is out of range"),
        ({"worker_index": -1}, "worker_index must be >= 0"),
        ({"parallel_shards": -1}, "parallel_shards must be >= 0"),
        ({"shuffle": True, "seed": "7"}, "seed must be an int"),
        ({"epoch": -1}, "epoch must be >= 0"),
        ({"start": N + 1}, "past the end of this worker's share"),
    ],
)
def test_bad_read_options_fail_before_anything_is_read(cc, sharded, kwargs, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        cc.dataset(sharded, **kwargs)
    with pytest.raises(InvalidArgumentError, match=message):
        cc.cache(source(), name=sharded, version=sharded, **kwargs)


def test_write_through_yields_source_order_first_then_the_shuffled_epochs(cc, name) -> None:
    ds = cc.cache(source(300), name=name, version="v", shuffle=True, seed=4)
    assert int(ds.cardinality()) == 300  # every iteration yields all 300, in some order
    first = ids(ds)
    assert first == list(range(300))  # the source streams through in its own order
    second = ids(ds)
    assert sorted(second) == list(range(300)) and second != first
    assert second == ids(cc.dataset(name, shuffle=True, seed=4, epoch=1))
    again = cc.cache(source(300), name=name, version="v", shuffle=True, seed=4)
    assert int(again.cardinality()) == 300
    assert ids(again) == ids(cc.dataset(name, shuffle=True, seed=4))


def test_stopping_a_parallel_shuffled_read_early_leaves_no_thread(
    cc, sharded, no_thread_leak
) -> None:
    ds = cc.dataset(sharded, shuffle=True, seed=1, parallel_shards=4, prefetch_bytes=16 << 10)
    assert len(list(ds.take(5).as_numpy_iterator())) == 5


def read_elements(
    cc: CacheClient, cache: str, indices: list[int], fingerprint: str = ""
) -> list[int]:
    """Call ReadElements directly; decode the "i" component of every record it returns."""
    from client.errors import from_rpc_error
    from client.format.blocks import decode_values
    from client.format.layout import Layout
    from client.format.values import Decompressor, split_chunk

    info = cc._get(cache)
    layout = Layout.from_json(info.layout_json)
    request = pb.ReadElementsRequest(
        name=cache,
        fingerprint=fingerprint,
        chunk_bytes=4096,
        indices=np.array(indices, "<u8").tobytes(),
    )
    dec = Decompressor()
    out: list[int] = []
    try:
        for chunk in cc._transport.stub.ReadElements(request):
            assert chunk.position == len(out)
            values = split_chunk(chunk.lengths, chunk.data)
            n, batch = decode_values(layout, dec, values)
            assert n == len(values)  # one element per value
            out += batch[0].tolist()  # leaves sorted: "i", then "x"
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, cc.target) from exc
    return out


def test_read_elements_returns_records_in_request_order_duplicates_included(cc, sharded) -> None:
    wanted = [999, 0, 500, 500, 1, 998, 90, 91, 89, *range(600, 100, -1)]
    assert read_elements(cc, sharded, wanted) == wanted  # chunks of 4 KiB: several


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([N], f"element index {N} is out of range: cache .* has {N} elements"),
        (list(range(65537)), "65537 indices in one ReadElements request; the limit is 65536"),
    ],
)
def test_read_elements_refuses_indices_past_the_end_or_too_many(
    cc, sharded, indices, message
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        read_elements(cc, sharded, indices)


def test_read_elements_refuses_a_replaced_cache(cc, sharded) -> None:
    with pytest.raises(FingerprintMismatchError, match="was replaced"):
        read_elements(cc, sharded, [1], fingerprint="graph:other")


def test_keras_fit_from_initial_epoch_reads_the_caches_epochs_in_whole_steps(cc, sharded) -> None:
    opts = {"shuffle": True, "seed": 8, "worker_index": 1, "num_workers": 3}  # share: 333
    seen: list[int] = []

    def note(i: tf.Tensor) -> tf.Tensor:
        seen.append(int(i))
        return tf.cast(i, tf.float32)

    def to_xy(e: dict) -> tuple[tf.Tensor, tf.Tensor]:
        y = tf.py_function(note, [e["i"]], tf.float32)
        return e["x"], tf.ensure_shape(y, [])

    ds = cc.dataset(sharded, epoch=2, **opts).map(to_xy).batch(50)
    assert int(ds.cardinality()) == 7  # ceil(333 / 50): what Keras plans its steps with
    steps: list[int] = []
    count = tf.keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: steps.append(0),
        on_train_batch_end=lambda batch, logs: steps.__setitem__(-1, steps[-1] + 1),
    )
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(ds, epochs=4, initial_epoch=2, verbose=0, shuffle=False, callbacks=[count])
    assert steps == [7, 7]
    expected = [ids(cc.dataset(sharded, epoch=e, **opts)) for e in (2, 3)]
    assert seen == expected[0] + expected[1]


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_readers_pass_counts_one_hit_however_many_shards_and_requests_it_takes(
    cc, daemon, shuffle
) -> None:
    name = f"hits-{shuffle}"
    with CacheClient(daemon.unix_target) as writer:
        cache = write_sharded(writer, source(), name, shard_bytes=3000)
    assert len(cache.shards) > 5
    before = cc.info(name).hits
    for w in range(2):  # one epoch, two workers: two passes
        ds = cc.dataset(
            name, shuffle=shuffle, seed=3, worker_index=w, num_workers=2, prefetch_bytes=64 << 10
        )  # many small requests per pass
        assert len(ids(ds)) == N // 2
    assert cc.info(name).hits - before == 2
    cc.delete(name)


@pytest.mark.parametrize("path", ["direct", "grpc", "plane"])
def test_a_pass_reuses_its_chunks_arrays_however_many_chunks_it_reads(
    daemon, path, buffer_pools
) -> None:
    """Memory flat in the data read: 100 chunks of 384 KiB arrays, a few buffers (the read's,
    which its later passes reuse)."""
    n, size = 300, 32768  # 128 KiB elements, random (stored as they are), 3 to a chunk
    with CacheClient(daemon.unix_target) as cc:
        name = f"reuse-{path}"
        ds = tf.data.Dataset.range(n).map(
            lambda i: {
                "x": tf.concat(
                    [[tf.cast(i, tf.float32)], tf.random.stateless_uniform([size - 1], [i, 0])], 0
                ),
                "i": i,
            }
        )
        cache = write_sharded(cc, ds, name, shard_bytes=4 << 20, chunk_bytes=1 << 20)
    assert cache.stored_bytes >= n * size * 4  # 100 chunks of prefetch_bytes / 8 each
    target = daemon.tcp_target if path == "plane" else daemon.unix_target
    with CacheClient(target) as cc:
        read = cc.dataset(name, prefetch_bytes=4 << 20, direct=path == "direct")
        assert [int(e["x"][0]) for e in read.as_numpy_iterator()] == list(range(n))
    (buffers,) = buffer_pools  # the read's, every pass's
    assert 0 < buffers.made <= 30, f"{buffers.made} buffers for 100 chunks"
    assert buffers.held() <= buffers.made
