"""Keras fit over a cache with client.keras.BackupAndRestore: the program of
tests/integration/test_fit_resume.py.

    python fit_resume.py TARGET NAME BACKUP_DIR OUT --batch B --epochs E --save-freq N
                         [--kill-at EPOCH,BATCH]

Trains on cc.dataset(NAME, shuffle=True, resume_from=BACKUP_DIR, batch_size=B)
and appends to OUT, as a JSON line per training step, the Keras epoch and the
ids the step trained on (the pipeline yields in order, so the step's ids are the
oldest batch the pipeline produced and no step has taken yet). --kill-at sends
this process SIGKILL after that step. Under TF_CONFIG each worker reads its
share (worker_index = its task index) under MultiWorkerMirroredStrategy, through
distribute_datasets_from_function (each worker's batches are its replica's) with
repeat() and steps_per_epoch, as tf-keras requires of a distributed dataset.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import tensorflow as tf

from client import CacheClient
from client.keras import BackupAndRestore

SEED = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("name")
    parser.add_argument("backup_dir")
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--save-freq", type=int, required=True)
    parser.add_argument("--kill-at", default=None)
    args = parser.parse_args()
    kill_at = tuple(map(int, args.kill_at.split(","))) if args.kill_at else None
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}"))
    workers = len(cluster.get("cluster", {}).get("worker", [])) or 1
    rank = cluster.get("task", {}).get("index", 0)
    strategy = (
        tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else tf.distribute.get_strategy()
    )
    produced: collections.deque[list[int]] = collections.deque()
    epoch = [0]

    def note(ids: np.ndarray) -> np.ndarray:
        produced.append(ids.tolist())
        return ids

    def to_xy(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        ids = tf.numpy_function(note, [batch["i"]], tf.int64)
        return batch["x"], tf.reshape(tf.cast(ids % 2, tf.float32), [-1, 1])

    out = args.out.open("a")

    def on_batch_end(batch: int, logs: Any) -> None:
        out.write(
            json.dumps({"epoch": int(epoch[0]), "batch": int(batch), "ids": produced.popleft()})
            + "\n"
        )
        out.flush()
        if kill_at == (int(epoch[0]), int(batch)):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_begin(e: int, logs: Any) -> None:
        epoch[0] = e

    with CacheClient(args.target) as cc:
        ds = (
            cc.dataset(
                args.name,
                shuffle=True,
                seed=SEED,
                worker_index=rank,
                num_workers=workers,
                resume_from=args.backup_dir,
                batch_size=args.batch,
            )
            .batch(args.batch)
            .map(to_xy)
        )
        steps = None
        if workers > 1:  # tf-keras wants steps_per_epoch over a distributed dataset: one
            # iterator for all epochs, each epoch a whole iteration of the cache's dataset
            steps = int(ds.cardinality())
            ds = strategy.distribute_datasets_from_function(lambda ctx: ds.repeat())
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(
            ds,
            epochs=args.epochs,
            steps_per_epoch=steps,
            verbose=0,
            callbacks=[
                tf.keras.callbacks.LambdaCallback(
                    on_epoch_begin=on_epoch_begin, on_train_batch_end=on_batch_end
                ),
                BackupAndRestore(args.backup_dir, save_freq=args.save_freq),
            ],
        )
    out.close()


if __name__ == "__main__":
    main()
