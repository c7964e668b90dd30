"""The pipelines of tests/integration/test_checkpoints.py, and its restoring process.

    python checkpoints.py restore TARGET CASE_JSON CHECKPOINT COUNT
        builds the case's dataset afresh, restores an iterator of it from CHECKPOINT
        and prints the ids of its next COUNT elements (batches flattened) as JSON.
    python checkpoints.py fit TARGET CASE_JSON BACKUP_DIR STOP_EPOCH STOP_BATCH
        runs model.fit over the case's dataset with BackupAndRestore(BACKUP_DIR),
        raising at (STOP_EPOCH, STOP_BATCH) unless STOP_EPOCH < 0, and prints as
        JSON the Keras epochs begun and the ids each training step got.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import tensorflow as tf

from client import CacheClient


def source(n: int, ragged: bool = False) -> tf.data.Dataset:
    """Element i holds i; ragged: x has i % 5 items (the generator path of cc.cache())."""
    def element(i: tf.Tensor) -> dict[str, tf.Tensor]:
        size = tf.cast(i % 5, tf.int32) if ragged else 8
        return {"x": tf.fill([size], tf.cast(i, tf.float32)), "i": i}
    return tf.data.Dataset.range(n).map(element)


def build(cc: CacheClient, case: dict[str, Any]) -> tf.data.Dataset:
    """The case's dataset: cc.dataset() or cc.cache(), repeated, batched if asked."""
    opts = {"prefetch_bytes": 16 << 10, **case.get("opts", {})}
    if case["kind"] == "dataset":
        ds = cc.dataset(case["name"], **opts)
    else:
        ds = cc.cache(source(case["n"], case.get("ragged", False)), name=case["name"],
                      version="v", **opts)
    ds = ds.batch(case["batch"]) if case.get("batch") else ds  # batch(): rebatch
    ds = ds.repeat()
    if case.get("unprefetched"):  # nothing reads ahead of the consumer
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
    return ds


def ids(element: dict[str, Any]) -> list[int]:
    assert np.all(element["x"] == np.reshape(element["i"], (-1, *[1] * (element["x"].ndim - 1)))
                  if element["x"].size else True), "an element's x is not its i"
    return np.ravel(element["i"]).tolist()


def restore(target: str, case: dict[str, Any], checkpoint: str, count: int) -> list[int]:
    with CacheClient(target) as cc:
        it = iter(build(cc, case))
        tf.train.Checkpoint(iterator=it).read(checkpoint).assert_consumed()
        return [i for _ in range(count) for i in ids(tf.nest.map_structure(
            lambda t: t.numpy(), next(it)))]


class Stop(Exception):
    """The interruption of the first fit."""


def fit(target: str, case: dict[str, Any], backup_dir: str, stop: tuple[int, int]
        ) -> dict[str, Any]:
    seen: list[list[int]] = []
    epochs: list[int] = []

    def note(i: tf.Tensor) -> tf.Tensor:
        seen.append(i.numpy().tolist())
        return tf.cast(i, tf.float32)

    def to_xy(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        y = tf.py_function(note, [batch["i"]], tf.float32)
        return batch["x"], tf.ensure_shape(y, [None])

    def interrupt(batch: int, logs: Any) -> None:
        if (epochs[-1], batch) == stop:
            raise Stop()

    with CacheClient(target) as cc:
        opts = {"prefetch_bytes": 16 << 10, **case.get("opts", {})}
        ds = cc.dataset(case["name"], **opts).batch(case["batch"]).map(to_xy)
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        callbacks = [
            tf.keras.callbacks.BackupAndRestore(backup_dir, save_freq=case["save_freq"]),
            tf.keras.callbacks.LambdaCallback(
                on_epoch_begin=lambda epoch, logs: epochs.append(epoch),
                on_train_batch_end=interrupt)]
        with contextlib.suppress(Stop):
            model.fit(ds, epochs=case["epochs"], verbose=0, shuffle=False, callbacks=callbacks)
    return {"epochs": epochs, "steps": seen}


def main(argv: list[str]) -> None:
    command, target, case = argv[0], argv[1], json.loads(argv[2])
    if command == "restore":
        out: Any = restore(target, case, argv[3], int(argv[4]))
    else:
        out = fit(target, case, argv[3], (int(argv[4]), int(argv[5])))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
