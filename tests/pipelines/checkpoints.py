"""The pipelines of tests/integration/test_checkpoints.py, and its restoring process.

python checkpoints.py restore TARGET CASE_JSON CHECKPOINT COUNT
    builds the case's dataset afresh, restores an iterator of it from CHECKPOINT
    and prints the ids of its next COUNT elements (batches flattened) as JSON.
"""

from __future__ import annotations

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
        ds = cc.cache(
            source(case["n"], case.get("ragged", False)), name=case["name"], version="v", **opts
        )
    ds = ds.batch(case["batch"]) if case.get("batch") else ds  # batch(): rebatch
    ds = ds.repeat()
    if case.get("unprefetched"):  # nothing reads ahead of the consumer
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
    return ds


def ids(element: dict[str, Any]) -> list[int]:
    assert np.all(
        element["x"] == np.reshape(element["i"], (-1, *[1] * (element["x"].ndim - 1)))
        if element["x"].size
        else True
    ), "an element's x is not its i"
    return np.ravel(element["i"]).tolist()


def restore(target: str, case: dict[str, Any], checkpoint: str, count: int) -> list[int]:
    with CacheClient(target) as cc:
        it = iter(build(cc, case))
        tf.train.Checkpoint(iterator=it).read(checkpoint).assert_consumed()
        return [
            i
            for _ in range(count)
            for i in ids(tf.nest.map_structure(lambda t: t.numpy(), next(it)))
        ]


def main(argv: list[str]) -> None:
    command, target, case = argv[0], argv[1], json.loads(argv[2])
    assert command == "restore", command
    print(json.dumps(restore(target, case, argv[3], int(argv[4]))))


if __name__ == "__main__":
    main(sys.argv[1:])
