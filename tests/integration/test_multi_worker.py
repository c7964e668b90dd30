"""Training under tf.distribute on a cache, each worker a real process.

Two workers on loopback under MultiWorkerMirroredStrategy (TF_CONFIG, free
ports) read their shares of one cache from one real daemon; a MirroredStrategy
over two logical CPUs writes a cache in its first epoch and reads it in the
second. The training itself runs in tests/pipelines/distributed_training.py, a
process per worker, which writes what it saw to a file read here. A worker that
fails or outlives its deadline gets its peers killed, so a dead peer cannot
leave the suite waiting in a collective.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import cluster
import pytest
import tensorflow as tf
from daemon import Daemon
from pipelines.distributed_training import features

PROGRAM = Path(__file__).parents[1] / "pipelines" / "distributed_training.py"
WORKERS = 2
SEED = 11
#: Run time is a few seconds per worker on two cores; the deadline only ends a hang.
DEADLINE_S = 240

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * DEADLINE_S)]


def write_cache(cc: Any, name: str, n: int) -> None:
    src = tf.data.Dataset.range(n).map(lambda i: {"id": i, "x": features(i)})
    for _ in cc.cache(src, name).batch(32):
        pass
    assert cc.info(name).state == "READY" and cc.info(name).num_elements == n


def run_program(
    mode: str,
    target: str,
    name: str,
    tmp_path: Path,
    elements: int,
    batch: int,
    workers: int = 1,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run the program as `workers` processes (a TF_CONFIG cluster when more than one).

    Returns each process's result; fails with the logs when any process fails or
    the deadline passes, killing the others.
    """
    outs = [tmp_path / f"{mode}-{i}.json" for i in range(workers)]
    logs = [tmp_path / f"{mode}-{i}.log" for i in range(workers)]
    argvs = [
        [
            str(PROGRAM),
            mode,
            target,
            name,
            str(out),
            "--seed",
            str(SEED),
            "--batch",
            str(batch),
            "--elements",
            str(elements),
        ]
        for out in outs
    ]
    with cluster.workers(argvs, logs, env) as procs:
        failure = cluster.wait_all(procs, time.monotonic() + DEADLINE_S)
    if failure:
        tails = "\n".join(
            f"--- worker {i} (rc {p.returncode}):\n" + logs[i].read_text(errors="replace")[-3000:]
            for i, p in enumerate(procs)
        )
        pytest.fail(f"{failure}\n{tails}")
    return [json.loads(out.read_text()) for out in outs]


def reference_orders(cc: Any, name: str, epochs: int) -> list[list[int]]:
    """The orders of the first epochs of a single-process shuffled read (same seed)."""
    ds = cc.dataset(name, shuffle=True, seed=SEED)
    return [[int(e["id"]) for e in ds.as_numpy_iterator()] for _ in range(epochs)]


def test_multi_worker_custom_loop_sees_each_element_once_per_epoch_in_a_new_order(
    cc: Any, daemon: Daemon, name: str, tmp_path: Path
) -> None:
    n = 101  # uneven shares: the last step gives worker 0 an empty batch
    write_cache(cc, name, n)
    results = run_program("loop", daemon.tcp_target, name, tmp_path, n, batch=10, workers=WORKERS)

    assert [r["shares"] for r in results] == [[50], [51]]
    orders = []
    for epoch in range(2):
        seen = [r["epochs"][epoch]["ids"] for r in results]
        assert sorted(seen[0] + seen[1]) == list(range(n)), f"epoch {epoch}"
        assert [len(s) for s in seen] == [50, 51]
        assert [r["epochs"][epoch]["count"] for r in results] == [n, n]  # all-reduced
        orders.append(seen[0] + seen[1])
    assert orders[0] != list(range(n))
    assert orders[1] != orders[0]
    assert set(orders[1][:50]) != set(orders[0][:50])  # the shares themselves change
    assert orders == reference_orders(cc, name, 2)


def test_keras_fit_multi_worker_trains_each_workers_share(
    cc: Any, daemon: Daemon, name: str, tmp_path: Path
) -> None:
    n, batch = 96, 8
    write_cache(cc, name, n)
    # Keras 3 fails under MultiWorkerMirroredStrategy even on a plain tf.data pipeline
    # (docs/reading.md, "Worker shares"); tf-keras runs it.
    results = run_program(
        "fit",
        daemon.tcp_target,
        name,
        tmp_path,
        n,
        batch=batch,
        workers=WORKERS,
        env={"TF_USE_LEGACY_KERAS": "1"},
    )

    share = n // WORKERS
    for r in results:
        assert r["keras"].startswith("tf_keras")
        assert r["shares"] == [share] and r["steps"] == share // batch
        assert len(r["history"]["loss"]) == 2
    reference = reference_orders(cc, name, 2)
    for epoch in range(2):
        produced = [r["produced"][epoch * share : (epoch + 1) * share] for r in results]
        assert produced[0] + produced[1] == reference[epoch], f"epoch {epoch}"
    assert all(len(r["produced"]) >= 2 * share for r in results)


def test_mirrored_strategy_writes_the_cache_in_epoch_one_and_reads_it_in_epoch_two(
    cc: Any, daemon: Daemon, name: str, tmp_path: Path
) -> None:
    n = 100
    (result,) = run_program("mirrored", daemon.tcp_target, name, tmp_path, n, batch=10)

    assert result["replicas"] == 2
    first, second = result["epochs"]
    for epoch in (first, second):
        assert sorted(epoch["ids"]) == list(range(n))
        assert epoch["count"] == n
    assert first["state"] == "READY" and first["num_elements"] == n
    assert first["source_elements_run"] == n
    assert second["source_elements_run"] == n  # epoch 2 ran no source element: a read
