"""Elastic resume against a real daemon: 4 workers stop mid-epoch, 3 or 6 go on.

Four workers read uneven parts of their shares of an epoch and stop; their
ReadStates, as one list, resume the epoch with another number of workers. What
the new workers' first iteration yields, with what the old ones read, must be
every element exactly once, split evenly; their next iteration is the normal
split of the next epoch. The checkpoint case runs each worker as a process
(tests/pipelines/elastic.py) that writes or reads tf.train.Checkpoint files.
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
from sharded import ids, write_sharded  # noqa: E402

from client import (  # noqa: E402
    CacheClient,
    CacheNotFoundError,
    ResumeMismatchError,
)

N = 1000  # in 11 shards of ~90: shares of 250 for the 4 old workers
COUNTS = [100, 0, 250, 173]  # what each old worker read: nothing, part, all of its share
PROGRAM = Path(__file__).resolve().parents[1] / "pipelines" / "elastic.py"


def source(n: int = N) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(
        lambda i: {"x": tf.fill([8], tf.cast(i, tf.float32)), "i": i}
    )


@pytest.fixture(scope="module")
def sharded(daemon) -> str:
    with CacheClient(daemon.unix_target) as cc:
        cache = write_sharded(
            cc, source(), "elastic-sharded", shard_bytes=400, chunk_bytes=100, block_bytes=400
        )
    assert len(cache.shards) > 5
    return cache.name


def stop_old_split(
    cc: CacheClient, read: Any, name: str, opts: dict[str, Any]
) -> tuple[list[int], list[Any]]:
    """The old workers read COUNTS of their shares and stop: (what they read, their states)."""
    seen, states = [], []
    for w, count in enumerate(COUNTS):
        seen += ids(read(worker_index=w, num_workers=len(COUNTS)).take(count))
        states.append(
            cc.read_state(
                name, elements_seen=count, worker_index=w, num_workers=len(COUNTS), **opts
            )
        )
    return seen, states


def check_resumed(
    cc: CacheClient,
    name: str,
    seen: list[int],
    firsts: list[list[int]],
    seconds: list[list[int]],
    opts: dict[str, Any],
) -> None:
    """The resumed epoch plus what was read is every element once, split evenly; the next
    iteration is the normal split of the next epoch."""
    assert sorted(seen + [i for first in firsts for i in first]) == list(range(N))
    sizes = [len(first) for first in firsts]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == N - sum(COUNTS)
    for j, second in enumerate(seconds):
        assert second == ids(
            cc.dataset(name, epoch=1, worker_index=j, num_workers=len(seconds), **opts)
        )
    assert sorted(i for second in seconds for i in second) == list(range(N))


@pytest.mark.parametrize("shuffle", [True, False, "shards"])
@pytest.mark.parametrize("new_workers", [3, 6])
def test_four_stopped_workers_are_resumed_by_another_count_exactly(
    cc, sharded, shuffle, new_workers
) -> None:
    opts = {"shuffle": shuffle, "seed": 23}
    seen, states = stop_old_split(cc, lambda **w: cc.dataset(sharded, **opts, **w), sharded, opts)
    states = [type(s).from_json(s.to_json()) for s in states]  # as a checkpoint keeps them
    resumed = [
        cc.dataset(sharded, resume=states, worker_index=j, num_workers=new_workers, **opts)
        for j in range(new_workers)
    ]
    assert all(int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY for ds in resumed)
    firsts = [ids(ds) for ds in resumed]
    seconds = [ids(ds) for ds in resumed]
    check_resumed(cc, sharded, seen, firsts, seconds, opts)
    if shuffle is False:  # what is left of the stored order is read as runs, in order
        assert all(first == sorted(first) for first in firsts)


def test_a_resumed_worker_stopped_again_resumes_with_its_own_state(cc, sharded) -> None:
    opts = {"shuffle": True, "seed": 4}
    seen, states = stop_old_split(cc, lambda **w: cc.dataset(sharded, **opts, **w), sharded, opts)
    first = ids(cc.dataset(sharded, resume=states, worker_index=1, num_workers=3, **opts))
    again = cc.read_state(
        sharded, elements_seen=40, resume=states, worker_index=1, num_workers=3, **opts
    )
    assert again.epoch == 0 and again.remaining is not None
    rest = ids(cc.dataset(sharded, resume=again, worker_index=1, num_workers=3, **opts))
    assert rest == first[40:]
    assert not set(first) & set(seen)


def test_an_iterator_of_a_resumed_read_saves_and_restores(cc, sharded, tmp_path) -> None:
    opts = {"shuffle": "shards", "seed": 6, "prefetch_bytes": 16 << 10}
    _, states = stop_old_split(
        cc, lambda **w: cc.dataset(sharded, **opts, **w), sharded, {"shuffle": "shards", "seed": 6}
    )

    def resumed() -> tf.data.Dataset:
        return cc.dataset(sharded, resume=states, worker_index=2, num_workers=3, **opts)

    whole = ids(resumed())
    it = iter(resumed())
    before = [int(next(it)["i"]) for _ in range(77)]
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    restored = iter(resumed())
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    assert before + [int(e["i"]) for e in restored] == whole


def test_read_epochs_of_cc_cache_resume_elastically(cc, name) -> None:
    opts = {"shuffle": True, "seed": 5}
    for _ in cc.cache(source(), name=name, version="v"):  # writes the cache
        pass

    def read(**worker: int) -> tf.data.Dataset:
        return cc.cache(source(), name=name, version="v", **opts, **worker)

    seen, states = stop_old_split(cc, read, name, opts)
    resumed = [read(resume=states, worker_index=j, num_workers=3) for j in range(3)]
    firsts = [ids(ds) for ds in resumed]
    seconds = [ids(ds) for ds in resumed]
    check_resumed(cc, name, seen, firsts, seconds, opts)


def test_states_that_cannot_resume_this_read_are_refused_saying_what_to_pass(cc, name) -> None:
    opts = {"shuffle": True, "seed": 3}
    for _ in cc.cache(source(100), name=name, version="1"):
        pass
    states = [
        cc.read_state(name, elements_seen=9, worker_index=w, num_workers=4, **opts)
        for w in range(4)
    ]
    with pytest.raises(ResumeMismatchError, match="pass the states of all the old workers"):
        cc.dataset(name, resume=states[1], worker_index=1, num_workers=3, **opts)
    with pytest.raises(ResumeMismatchError, match=r"old workers \[2\] of 4 are missing"):
        cc.dataset(name, resume=[states[0], states[1], states[3]], num_workers=3, **opts)
    with pytest.raises(ResumeMismatchError, match="pass seed=3"):
        cc.dataset(name, resume=states, num_workers=3, shuffle=True, seed=4)
    with pytest.raises(ResumeMismatchError, match="saved with shuffle='elements'"):
        cc.dataset(name, resume=states, num_workers=3, shuffle="shards", seed=3)
    late = cc.read_state(name, elements_seen=30, worker_index=3, num_workers=4, **opts)
    with pytest.raises(ResumeMismatchError, match=r"epochs \[0, 1\]"):
        cc.dataset(name, resume=[*states[:3], late], num_workers=3, **opts)
    cc.delete(name)
    for _ in cc.cache(source(100), name=name, version="2"):  # rebuilt: another fingerprint
        pass
    with pytest.raises(ResumeMismatchError, match="saved with fingerprint="):
        cc.dataset(name, resume=states, num_workers=3, **opts)
    with pytest.raises(CacheNotFoundError, match="not READY on this daemon"):
        cc.cache(source(100), name=f"{name}-absent", resume=states, num_workers=3, **opts)


@pytest.mark.slow
def test_checkpoints_of_four_worker_processes_are_resumed_by_three(
    daemon, sharded, tmp_path
) -> None:
    """Each old worker saves tf.train.Checkpoint(step=count, iterator=it) and exits; each
    new one rebuilds the old ReadStates from the counters in their checkpoints."""

    def run_all(args: list[list[str]]) -> list[dict[str, Any]]:
        outs = [tmp_path / f"out-{a[0]}-{i}.json" for i, a in enumerate(args)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(PROGRAM),
                    *a[:5],
                    *([*a[5:], str(out)] if a[0] == "read" else [str(out), *a[5:]]),
                ],
                env=env_without_tf_noise(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for a, out in zip(args, outs)
        ]
        for proc in procs:
            log, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, log.decode(errors="replace")[-3000:]
        return [json.loads(out.read_text()) for out in outs]

    target = daemon.unix_target
    old = run_all(
        [
            ["read", target, sharded, str(w), "4", str(count), str(tmp_path / f"old-{w}" / "ckpt")]
            for w, count in enumerate(COUNTS)
        ]
    )
    checkpoints = [r["checkpoint"] for r in old]
    new = run_all([["resume", target, sharded, str(j), "3", *checkpoints] for j in range(3)])
    seen = [i for r in old for i in r["ids"]]
    with CacheClient(target) as cc:
        check_resumed(
            cc,
            sharded,
            seen,
            [r["first"] for r in new],
            [r["second"] for r in new],
            {"shuffle": True, "seed": 17},
        )
