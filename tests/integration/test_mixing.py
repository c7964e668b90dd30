"""cc.mix() against a real daemon: exact proportions, draws, shares, resume, refusals.

Three caches of several shards each (300, 120 and 50 elements) mixed 1:2:1 over
epochs of their 470 elements together: the first is undersampled, the last drawn
more than twice per epoch. Each element's "i" is 10000 * source + its index in
its cache, so a read names every draw.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

from sharded import ids, write_sharded  # noqa: E402

from client import (  # noqa: E402
    CacheClient,
    InvalidArgumentError,
    ResumeMismatchError,
)
from client.read.planning.mix import apportion  # noqa: E402

SIZES = {"a": 300, "b": 120, "c": 50}
WEIGHTS = {"a": 1, "b": 2, "c": 1}
TOTAL = sum(SIZES.values())
COUNTS = dict(zip(sorted(SIZES), apportion([1, 2, 1], TOTAL)))  # 118, 235, 117


def source(offset: int, n: int) -> tf.data.Dataset:
    return tf.data.Dataset.range(offset, offset + n).map(
        lambda i: {"x": tf.fill([4], tf.cast(i, tf.float32)), "i": i}
    )


@pytest.fixture(scope="module")
def caches(daemon) -> dict[str, str]:
    """Weights by cache name: three multi-shard caches, blocked and not."""
    names = {}
    with CacheClient(daemon.unix_target) as cc:
        for k, (key, n) in enumerate(sorted(SIZES.items())):
            cache = write_sharded(
                cc,
                source(10000 * k, n),
                f"mixing-{key}",
                shard_bytes=500,
                chunk_bytes=100,
                block_bytes=200 if k == 1 else None,
                batch_elements=16,
            )
            assert len(cache.shards) > 1
            names[key] = cache.name
    return {names[key]: w for key, w in WEIGHTS.items()}


def by_source(epoch: list[int]) -> dict[str, int]:
    counts = collections.Counter(i // 10000 for i in epoch)
    return {key: counts[k] for k, key in enumerate(sorted(SIZES))}


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
def test_each_epoch_holds_exact_counts_and_draws_every_element_evenly(cc, caches, shuffle) -> None:
    ds = cc.mix(caches, seed=5, shuffle=shuffle)
    assert int(ds.cardinality()) == TOTAL
    drawn: collections.Counter[int] = collections.Counter()
    epochs = []
    for k in range(1, 4):
        epoch = ids(ds)
        epochs.append(epoch)
        assert by_source(epoch) == COUNTS
        drawn.update(epoch)
        for s, key in enumerate(sorted(SIZES)):  # after k epochs: k*n//s times, or once more
            low = k * COUNTS[key] // SIZES[key]
            times = [drawn[10000 * s + i] for i in range(SIZES[key])]
            assert set(times) <= {low, low + 1}, (key, k)
    assert epochs[0] != epochs[1]  # each epoch its own order
    assert epochs[0][:50] != sorted(epochs[0][:50])  # interleaved


def test_the_order_is_a_function_of_the_seed(cc, caches) -> None:
    first = ids(cc.mix(caches, seed=7, shuffle=True))
    assert ids(cc.mix(dict(reversed(caches.items())), seed=7, shuffle=True)) == first
    assert ids(cc.mix(caches, seed=8, shuffle=True)) != first
    assert ids(cc.mix(caches, seed=7, shuffle=True, epoch=1)) != first


def test_size_sets_the_epoch_and_counts_follow_the_weights(cc, caches) -> None:
    epoch = ids(cc.mix(caches, seed=1, size=1001))
    assert len(epoch) == 1001
    assert by_source(epoch) == dict(zip(sorted(SIZES), apportion([1, 2, 1], 1001)))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_workers", [3, 4])
def test_worker_shares_are_disjoint_runs_of_the_whole_epoch(
    cc, caches, shuffle, num_workers
) -> None:
    whole = ids(cc.mix(caches, seed=3, shuffle=shuffle, epoch=2))
    shares = [
        ids(
            cc.mix(
                caches, seed=3, shuffle=shuffle, epoch=2, worker_index=w, num_workers=num_workers
            )
        )
        for w in range(num_workers)
    ]
    assert [i for share in shares for i in share] == whole
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("direct", [True, False])
def test_direct_and_streamed_reads_give_the_same_mix(cc, caches, daemon, direct) -> None:
    expected = ids(cc.mix(caches, seed=9, shuffle="shards", direct=False))
    with CacheClient(daemon.tcp_target) as remote:  # a remote client: the data plane
        assert ids(remote.mix(caches, seed=9, shuffle="shards")) == expected
    assert ids(cc.mix(caches, seed=9, shuffle="shards", direct=direct)) == expected


def test_resume_from_a_read_state_gives_exactly_the_rest(cc, caches) -> None:
    opts: dict[str, Any] = {"seed": 4, "shuffle": True, "worker_index": 1, "num_workers": 2}
    ds = cc.mix(caches, **opts)
    first, second = ids(ds), ids(ds)
    state = cc.mix_read_state(caches, elements_seen=len(first) + 100, **opts)
    assert (state.epoch, state.start) == (1, 100)
    resumed = cc.mix(caches, resume=state, **opts)
    assert ids(resumed) == second[100:]
    assert ids(resumed) == ids(cc.mix(caches, epoch=2, **opts))  # then the next epoch


def test_elastic_resume_of_a_mix_reads_what_the_old_split_left(cc, caches) -> None:
    opts: dict[str, Any] = {"seed": 6, "shuffle": True}
    whole = ids(cc.mix(caches, **opts))
    seen, states = [], []
    for w, count in enumerate([30, 0, 117, 71]):  # 117 or 118 each: one read it all
        seen += ids(cc.mix(caches, worker_index=w, num_workers=4, **opts).take(count))
        states.append(
            cc.mix_read_state(caches, elements_seen=count, worker_index=w, num_workers=4, **opts)
        )
    rest = [
        ids(cc.mix(caches, resume=states, worker_index=j, num_workers=3, **opts).take(TOTAL))
        for j in range(3)
    ]
    assert sorted(seen + [i for share in rest for i in share]) == sorted(whole)
    assert max(map(len, rest)) - min(map(len, rest)) <= 1


def test_resume_with_another_seed_or_mix_is_refused(cc, caches) -> None:
    state = cc.mix_read_state(caches, elements_seen=10, seed=1)
    with pytest.raises(ResumeMismatchError, match="pass seed=1"):
        cc.mix(caches, seed=2, resume=state)
    with pytest.raises(ResumeMismatchError, match="cache="):
        cc.mix({**caches, next(iter(caches)): 5}, seed=1, resume=state)
    with pytest.raises(InvalidArgumentError, match="needs seed="):
        cc.mix(caches, resume=state)


def test_an_iterator_checkpoint_restores_the_mix_position(cc, caches, tmp_path) -> None:
    whole = ids(cc.mix(caches, seed=2, shuffle=True))
    it = iter(cc.mix(caches, seed=2, shuffle=True))
    for _ in range(150):
        next(it)
    path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
    restored = iter(cc.mix(caches, seed=2, shuffle=True))
    tf.train.Checkpoint(iterator=restored).restore(path)
    assert [int(e["i"]) for e in restored] == whole[150:]


def test_caches_of_other_elements_are_refused_by_name(cc, caches, name) -> None:
    other = tf.data.Dataset.range(20).map(lambda i: {"x": tf.fill([3], 1.0), "i": i})
    for _ in cc.cache(other, name):
        pass
    with pytest.raises(InvalidArgumentError, match=rf"cannot mix caches .*{name}.*shape=\(3,\)"):
        cc.mix({**caches, name: 1}, seed=0)


def test_bad_weights_are_refused(cc, caches) -> None:
    with pytest.raises(InvalidArgumentError, match="dict of cache names"):
        cc.mix([], seed=0)
    with pytest.raises(InvalidArgumentError, match="must be a finite number > 0"):
        cc.mix({next(iter(caches)): 0}, seed=0)
    with pytest.raises(InvalidArgumentError, match="needs seed="):
        cc.mix(caches, num_workers=2)


def test_a_mix_of_32_small_caches(cc, name) -> None:
    names = {}
    for k in range(32):
        cache = f"{name}-{k}"
        for _ in cc.cache(source(10000 * k, 10 + k), cache):
            pass
        names[cache] = 1 + k % 4
    ds = cc.mix(names, seed=12, shuffle=True, size=2000)
    epoch = ids(ds)
    counts = collections.Counter(i // 10000 for i in epoch)
    order = sorted(names)  # counts follow the caches in name order
    expected = apportion([names[n] for n in order], 2000)
    assert [counts[int(n.rsplit("-", 1)[1])] for n in order] == expected
    assert ids(ds) != epoch


def test_ragged_and_string_elements_come_back_in_the_mixed_order(cc, name) -> None:
    def ragged(offset: int) -> tf.data.Dataset:
        return tf.data.Dataset.range(offset, offset + 40).map(
            lambda i: {"v": tf.range(i % 7), "s": tf.strings.as_string(i), "i": i}
        )

    names = {f"{name}-{k}": k + 1 for k in range(2)}
    for k, cache in enumerate(names):
        for _ in cc.cache(ragged(10000 * k), cache):
            pass
    for shuffle in (False, True):
        for element in cc.mix(names, seed=3, shuffle=shuffle).as_numpy_iterator():
            i = int(element["i"])
            assert list(element["v"]) == list(range(i % 7))
            assert element["s"] == str(i).encode()
