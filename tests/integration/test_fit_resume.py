"""A real Keras fit killed mid-epoch (SIGKILL) and run again continues its interrupted epoch
at the next unseen batch: every element trained exactly once per epoch, as in an
uninterrupted fit, whose epochs are the cache's epochs read in order.

The fits run in tests/pipelines/fit_resume.py, one process per worker: Keras 3 on one
worker, and tf-keras under MultiWorkerMirroredStrategy on two (TF_CONFIG, loopback).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

import cluster  # noqa: E402
from sharded import write_sharded  # noqa: E402

from client import CacheClient  # noqa: E402
from client.tf.fit import position  # noqa: E402

PROGRAM = Path(__file__).resolve().parents[1] / "pipelines" / "fit_resume.py"
N, BATCH, EPOCHS, SAVE_FREQ = 300, 16, 3, 4
DEADLINE_S = 240
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * DEADLINE_S)]


@pytest.fixture(scope="module")
def cache(daemon) -> str:
    src = tf.data.Dataset.range(N).map(
        lambda i: {"x": tf.fill([8], tf.cast(i, tf.float32)), "i": i}
    )
    with CacheClient(daemon.unix_target) as cc:
        return write_sharded(cc, src, "fit-resume", shard_bytes=4000).name


def fit(
    daemon,
    name: str,
    backup: Path,
    outs: list[Path],
    env: dict[str, str],
    kill_at: tuple[int, int] | None = None,
) -> None:
    """Run the fit on len(outs) workers; with kill_at, worker 0 kills itself after that step
    and the others are killed once it is gone (they would wait in a collective)."""
    argvs = [
        [
            str(PROGRAM),
            daemon.unix_target,
            name,
            str(backup),
            str(out),
            "--batch",
            str(BATCH),
            "--epochs",
            str(EPOCHS),
            "--save-freq",
            str(SAVE_FREQ),
            *(["--kill-at", f"{kill_at[0]},{kill_at[1]}"] if kill_at and rank == 0 else []),
        ]
        for rank, out in enumerate(outs)
    ]
    logs = [out.with_suffix(".log") for out in outs]

    def tail(rank: int) -> str:
        return logs[rank].read_text(errors="replace")[-3000:]

    with cluster.workers(argvs, logs, env) as procs:
        first = procs[0].wait(timeout=DEADLINE_S)
        if kill_at:
            assert first == -9, tail(0)
            return
        failure = cluster.wait_all(procs, time.monotonic() + DEADLINE_S)
        assert failure is None, f"{failure}: " + "\n".join(tail(r) for r in range(len(outs)))


def steps(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def by_epoch(records: list[dict[str, Any]]) -> dict[int, list[list[int]]]:
    epochs: dict[int, list[list[int]]] = {}
    for record in records:
        epochs.setdefault(record["epoch"], []).append(record["ids"])
    return epochs


@pytest.mark.parametrize(
    "workers,env,kills",
    [
        (1, {}, [(1, 6), (1, 8)]),
        (2, {"TF_USE_LEGACY_KERAS": "1"}, [(1, 6)]),
    ],
    ids=["keras3-killed-twice-in-an-epoch", "tf-keras-multi-worker"],
)
def test_a_killed_fit_run_again_trains_each_element_once_per_epoch(
    daemon, cache, tmp_path, workers, env, kills
) -> None:
    """Keras 3 numbers a resumed epoch's batches from 0: the second kill, in the same epoch,
    shows that the position still counts from the epoch's start."""
    backup = tmp_path / "backup"
    trained: list[dict[int, list[list[int]]]] = [{} for _ in range(workers)]
    at = (0, 0)  # where each run begins: (epoch, batches of it trained)
    for run, kill in enumerate([*kills, None]):
        outs = [tmp_path / f"run{run}-{w}.jsonl" for w in range(workers)]
        fit(daemon, cache, backup, outs, env, kill_at=kill)
        end = position(backup) if kill else (EPOCHS, 0)
        assert end is not None and end > at  # each run's backups moved on
        for w in range(workers):
            epochs = by_epoch(steps(outs[w]))
            if run:
                assert min(epochs) == at[0] and len(epochs[at[0]]) < len(trained[w][0])
            for e, batches in epochs.items():  # keep what the backed-up weights trained
                kept = batches if e < end[0] else batches[: end[1] - (at[1] if e == at[0] else 0)]
                trained[w].setdefault(e, []).extend(kept if e <= end[0] else [])
        at = end

    with CacheClient(daemon.unix_target) as cc:
        for w in range(workers):
            for e in range(EPOCHS):
                uninterrupted = [
                    int(x["i"])
                    for x in cc.dataset(
                        cache, shuffle=True, seed=5, epoch=e, worker_index=w, num_workers=workers
                    ).as_numpy_iterator()
                ]
                assert [i for ids in trained[w][e] for i in ids] == uninterrupted, (
                    f"worker {w}, epoch {e}"
                )


def test_resume_from_refuses_what_it_cannot_use(cc, cache, tmp_path) -> None:
    from client import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="batch_size="):
        cc.dataset(cache, resume_from=tmp_path)
    with pytest.raises(InvalidArgumentError, match="either resume_from="):
        cc.dataset(cache, resume_from=tmp_path, batch_size=4, start=3)
    assert int(cc.dataset(cache, resume_from=tmp_path, batch_size=4).cardinality()) == N
    (tmp_path / "shardcache_position.json").write_text('{"epoch": 1}')
    with pytest.raises(InvalidArgumentError, match="delete it to start"):
        cc.dataset(cache, resume_from=tmp_path, batch_size=4)
    (tmp_path / "shardcache_position.json").write_text('{"epoch": 1, "batches": 5}')
    ds = cc.dataset(cache, shuffle=True, seed=5, resume_from=tmp_path, batch_size=4)
    assert int(ds.cardinality()) == N  # a whole epoch's, for Keras's step count
    epoch1 = [
        int(x["i"]) for x in cc.dataset(cache, shuffle=True, seed=5, epoch=1).as_numpy_iterator()
    ]
    assert [int(x["i"]) for x in ds.as_numpy_iterator()] == epoch1[20:]
