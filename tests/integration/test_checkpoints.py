"""tf.train.Checkpoint(iterator=it) over cache datasets, restored in a fresh process.

Each case saves an iterator here, mid-epoch after an epoch boundary, and a new
process (tests/pipelines/checkpoints.py) builds the same dataset, restores the
iterator and reads on: its elements must be exactly the ones not yet delivered,
in the order an uninterrupted iterator yields them, across the next epoch too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

from daemon import env_without_tf_noise  # noqa: E402
from sharded import write_sharded  # noqa: E402

from client import CacheClient  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "pipelines" / "checkpoints.py"
sys.path.insert(0, str(SCRIPT.parent))
import checkpoints  # noqa: E402

N = 1000  # elements of the sharded cache, in 11 shards of ~90


def run(*args: Any) -> Any:
    """tests/pipelines/checkpoints.py in a fresh process; its JSON output."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env_without_tf_noise(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sharded(daemon) -> str:
    with CacheClient(daemon.unix_target) as cc:
        cache = write_sharded(
            cc,
            checkpoints.source(N),
            "checkpoints-sharded",
            shard_bytes=400,
            chunk_bytes=100,
            block_bytes=400,
        )
    assert len(cache.shards) > 5
    return cache.name


def consume(it: Any, count: int) -> list[int]:
    return [
        i
        for _ in range(count)
        for i in checkpoints.ids(tf.nest.map_structure(lambda t: t.numpy(), next(it)))
    ]


def save_and_restore(
    daemon, case: dict[str, Any], tmp_path: Path, skip: int, count: int
) -> tuple[list[int], list[int], list[int]]:
    """(delivered before the save, what this process reads next, what a new one reads next)."""
    with CacheClient(daemon.unix_target) as cc:
        it = iter(checkpoints.build(cc, case))
        before = consume(it, skip)
        path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
        here = consume(it, count)
    there = run("restore", daemon.unix_target, json.dumps(case), path, count)
    return before, here, there


def epochs_of(cc: CacheClient, name: str, count: int, **opts: Any) -> list[int]:
    """The ids of epochs 0..count-1 of cc.dataset(name, **opts), one after the other."""
    return [
        int(element["i"])
        for e in range(count)
        for element in cc.dataset(name, epoch=e, **opts).as_numpy_iterator()
    ]


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"shuffle": True, "seed": 7},
        {"shuffle": "shards", "seed": 7},
        {"shuffle": True, "seed": 7, "worker_index": 1, "num_workers": 3},
        {"shuffle": True, "seed": 7, "parallel_shards": 3},
    ],
    ids=["plain", "shuffled", "shards", "worker-share", "parallel"],
)
def test_a_restored_read_continues_with_exactly_the_undelivered_elements(
    daemon, sharded, tmp_path, opts
) -> None:
    with CacheClient(daemon.unix_target) as cc:
        share = int(cc.dataset(sharded, **opts).cardinality())
        expected = epochs_of(cc, sharded, 3, **opts)
    if not opts:  # the stored order is the source's: what ds.cache() yields
        cached = [int(e["i"]) for e in checkpoints.source(N).cache().as_numpy_iterator()]
        assert expected == cached * 3
    else:
        assert expected[:share] != expected[share : 2 * share]  # reshuffled per epoch
    skip = share + 137  # inside epoch 1; the restored read runs on into epoch 2
    case = {"kind": "dataset", "name": sharded, "opts": opts}
    before, here, there = save_and_restore(daemon, case, tmp_path, skip, share)
    assert before == expected[:skip]
    assert here == expected[skip : skip + share]
    assert there == here


@pytest.mark.parametrize(
    "skip,unprefetched",
    [(16, False), (16, True), (18, False)],
    ids=["after-an-epochs-last-batch", "after-it-unprefetched", "mid-epoch"],
)
def test_batches_of_a_restored_read_are_the_uninterrupted_ones(
    daemon, sharded, tmp_path, skip, unprefetched
) -> None:
    """batch() on the cache's dataset (rebatch) saves and restores too; saved right after
    an epoch's short last batch, the restored read goes on with the next epoch, also when
    nothing read ahead into it (the rebatch has let go of the epoch's chunks)."""
    opts = {"shuffle": True, "seed": 3}
    case = {
        "kind": "dataset",
        "name": sharded,
        "opts": opts,
        "batch": 64,
        "unprefetched": unprefetched,
    }
    with CacheClient(daemon.unix_target) as cc:
        expected = epochs_of(cc, sharded, 2, **opts)
    before, here, there = save_and_restore(daemon, case, tmp_path, skip, 10)  # 16 an epoch
    batches = [
        expected[s : min(s + 64, (e + 1) * N)]
        for e in range(2)
        for s in range(e * N, (e + 1) * N, 64)
    ]
    assert before == [i for b in batches[:skip] for i in b]
    assert here == [i for b in batches[skip : skip + 10] for i in b]
    assert there == here


@pytest.mark.parametrize("ragged", [False, True], ids=["tapped", "generator-path"])
def test_a_cache_read_epoch_restores_in_a_new_process(daemon, tmp_path, name, ragged) -> None:
    n = 600
    case = {
        "kind": "cache",
        "name": name,
        "n": n,
        "ragged": ragged,
        "opts": {"shuffle": True, "seed": 5},
    }
    skip = n + 250  # epoch 0 wrote the cache in source order; epoch 1 reads it shuffled
    before, here, there = save_and_restore(daemon, case, tmp_path, skip, n)
    with CacheClient(daemon.unix_target) as cc:
        expected = list(range(n)) + epochs_of(cc, name, 3, shuffle=True, seed=5)[n:]
    assert before == expected[:skip]
    assert here == expected[skip : skip + n]
    assert there == here


def test_a_write_epoch_restores_into_the_rest_of_the_source_uncached(
    daemon, cc, name, tmp_path
) -> None:
    """As ds.cache() allows: the restored iteration runs the source on from the saved
    position without writing (here, beside the live write, and in a new process); the
    live one commits the cache alone, and the next epoch reads it."""
    n, skip = 300, 120
    case = {"kind": "cache", "name": name, "n": n, "opts": {"shuffle": True, "seed": 5}}
    it = iter(checkpoints.build(cc, case))
    assert consume(it, skip) == list(range(skip))
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    beside = iter(checkpoints.build(cc, case))
    tf.train.Checkpoint(iterator=beside).read(path).assert_consumed()
    assert consume(beside, n - skip) == list(range(skip, n))  # taps nothing of its own
    del beside
    here = consume(it, n)  # the write's rest, committed, then the first read epoch
    assert cc.info(name).num_elements == n
    assert here[: n - skip] == list(range(skip, n))
    assert here[n - skip :] == epochs_of(cc, name, 2, shuffle=True, seed=5)[n : n + skip]
    there = run("restore", daemon.unix_target, json.dumps(case), path, n)
    assert there == here
    assert cc.info(name).num_elements == n


def test_saving_in_a_write_epoch_of_the_generator_path_fails_and_the_write_goes_on(
    cc, name, tmp_path
) -> None:
    """A source of unknown cardinality is read in Python (from_generator), which cannot
    be saved; the read epochs of the same dataset save."""
    ds = cc.cache(
        checkpoints.source(300, ragged=True).filter(lambda e: True), name=name, version="v"
    )
    it = iter(ds)
    first = consume(it, 10)
    with pytest.raises(tf.errors.UnimplementedError, match="does not support checkpointing"):
        tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    assert first + [int(e["i"]) for e in it] == list(range(300))
    assert cc.info(name).state == "READY"  # the failed save did not disturb the write
    it = iter(ds)  # a read epoch of the same dataset saves
    consume(it, 5)
    tf.train.Checkpoint(iterator=it).write(str(tmp_path / "read"))


def test_an_iterator_dropped_mid_epoch_stops_its_stream(cc, sharded, no_thread_leak) -> None:
    it = iter(cc.dataset(sharded, shuffle=True, seed=1, parallel_shards=3, prefetch_bytes=16 << 10))
    consume(it, 5)
    del it  # the stream's threads end with the iterator, not with the dataset


def test_a_stateful_function_of_the_users_fails_the_save_as_after_ds_cache(
    cc, sharded, tmp_path
) -> None:
    """The cache's dataset saves with no flag and sets no state policy: a py_function after
    it is refused at the save, as after ds.cache(), and the read goes on."""

    def mapped(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.map(lambda e: {**e, "i": tf.py_function(lambda i: i, [e["i"]], tf.int64)})

    for ds in (mapped(cc.dataset(sharded)), mapped(checkpoints.source(N).cache())):
        it = iter(ds)
        first = consume(it, 10)
        with pytest.raises(tf.errors.FailedPreconditionError, match="stateful"):
            tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
        assert first + [int(e["i"]) for e in it] == list(range(N))
