"""The worker processes of tests/integration/test_elastic_resume.py's checkpoint case.

python elastic.py read TARGET NAME WORKER WORKERS COUNT CHECKPOINT OUT
    reads COUNT elements of worker WORKER of WORKERS's share (shuffled), counting
    them in a tf.Variable, writes tf.train.Checkpoint(step=..., iterator=...) to
    CHECKPOINT and stops; OUT gets the ids read and the checkpoint's path.
python elastic.py resume TARGET NAME WORKER WORKERS OUT CHECKPOINT...
    resumes from the checkpoints of every old worker (their order is their
    worker_index): their step counters make the old split's ReadStates, and
    this worker reads its share of what they left unread, then the next
    epoch; OUT gets the ids of both iterations.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensorflow as tf

from client import CacheClient

OPTS = {"shuffle": True, "seed": 17}


def ids(ds: tf.data.Dataset) -> list[int]:
    return [int(element["i"]) for element in ds.as_numpy_iterator()]


def read(
    target: str, name: str, worker: int, workers: int, count: int, checkpoint: str
) -> dict[str, object]:
    with CacheClient(target) as cc:
        ds = cc.dataset(name, worker_index=worker, num_workers=workers, **OPTS).repeat()
        it, step = iter(ds), tf.Variable(0, dtype=tf.int64)
        seen = []
        for _ in range(count):
            seen.append(int(next(it)["i"]))
            step.assign_add(1)
        path = tf.train.Checkpoint(step=step, iterator=it).write(checkpoint)
    return {"ids": seen, "checkpoint": path}


def resume(
    target: str, name: str, worker: int, workers: int, checkpoints: list[str]
) -> dict[str, object]:
    with CacheClient(target) as cc:
        states = [
            cc.read_state(
                name,
                worker_index=w,
                num_workers=len(checkpoints),
                **OPTS,
                elements_seen=int(
                    tf.train.load_checkpoint(path).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")
                ),
            )
            for w, path in enumerate(checkpoints)
        ]
        ds = cc.dataset(name, resume=states, worker_index=worker, num_workers=workers, **OPTS)
        return {"first": ids(ds), "second": ids(ds)}


def main(argv: list[str]) -> None:
    mode, target, name, worker, workers = argv[:5]
    if mode == "read":
        count, checkpoint, out = argv[5:8]
        result = read(target, name, int(worker), int(workers), int(count), checkpoint)
    else:
        out, checkpoints = argv[5], argv[6:]
        result = resume(target, name, int(worker), int(workers), checkpoints)
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
