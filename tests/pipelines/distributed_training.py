"""Training under tf.distribute on a cache: the program tests/integration/test_multi_worker.py runs.

    python distributed_training.py MODE TARGET NAME OUT [--seed S] [--batch B] [--elements N]

MODE is one of:

* ``loop``: one worker of a MultiWorkerMirroredStrategy cluster (TF_CONFIG names
  it); each worker's input is ``cc.dataset(NAME, shuffle=True, worker_index=,
  num_workers=)`` from ``distribute_datasets_from_function``, trained by a custom
  loop for two epochs. OUT gets, per epoch, the element ids this worker's replica
  consumed in order and the element count all-reduced over the cluster.
* ``fit``: the same cluster and input, trained by ``tf.keras`` ``Model.fit`` for
  two epochs of ``(N // workers) // B`` steps over the repeated share (run it
  with TF_USE_LEGACY_KERAS=1: Keras 3 fails under this strategy). OUT gets the
  ids the input pipeline produced, in order (prefetching may add some of a
  third epoch), and the history.
* ``mirrored``: a MirroredStrategy over two logical CPUs in this process, on
  ``experimental_distribute_dataset(cc.cache(source, NAME).batch(B))``; N
  elements from ``range(N)``, two epochs by a custom loop. OUT gets, per epoch,
  the ids both replicas consumed, the all-reduced count, how many source
  elements had run by the end of it and the cache's state.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from client import CacheClient

FEATURES = 4
EPOCHS = 2


def features(i: tf.Tensor) -> tf.Tensor:
    """The element with id i: a small float vector derived from it."""
    return tf.cast(i, tf.float32) * tf.range(1.0, FEATURES + 1.0) / 100.0


def labels(ids: tf.Tensor) -> tf.Tensor:
    return tf.cast(ids % 2, tf.float32)[:, None]


def train_step(
    strategy: tf.distribute.Strategy, weights: tf.Variable, global_batch: int, spec: Any
) -> Any:
    """One synchronous step: gradients summed over all replicas, counts all-reduced.

    A replica whose share has run out gets an empty batch (the strategy's
    partial batch handling), so every replica takes part in every all-reduce.
    """

    def replica_step(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            error = tf.matmul(batch["x"], weights) - labels(batch["id"])
            loss = tf.reduce_sum(error**2) / global_batch
        weights.assign_sub(0.01 * tape.gradient(loss, weights))  # SUM over replicas
        count = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.shape(batch["id"])[0]
        )
        return batch["id"], count

    @tf.function(input_signature=[spec])
    def step(batch: Any) -> Any:
        return strategy.run(replica_step, args=(batch,))

    return step


def run_epochs(
    strategy: tf.distribute.Strategy, dist: Any, step: Any, after_epoch: Any = None
) -> list[dict[str, Any]]:
    epochs = []
    for _ in range(EPOCHS):
        ids: list[int] = []
        total = 0
        for batch in dist:
            local_ids, count = step(batch)
            for replica_ids in strategy.experimental_local_results(local_ids):
                ids.extend(int(i) for i in replica_ids.numpy())
            total += int(strategy.experimental_local_results(count)[0])
        epochs.append({"ids": ids, "count": total, **(after_epoch() if after_epoch else {})})
    return epochs


def summed_weights(strategy: tf.distribute.Strategy) -> tf.Variable:
    with strategy.scope():
        return tf.Variable(tf.zeros([FEATURES, 1]), aggregation=tf.VariableAggregation.SUM)


def worker_datasets(cc: CacheClient, args: argparse.Namespace, shares: list[int]) -> Any:
    """dataset_fn for distribute_datasets_from_function: this worker's share of the cache."""

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = cc.dataset(
            args.name,
            shuffle=True,
            seed=args.seed,
            worker_index=ctx.input_pipeline_id,
            num_workers=ctx.num_input_pipelines,
        )
        shares.append(int(ds.cardinality()))
        return ds

    return dataset_fn


def multi_worker_loop(cc: CacheClient, args: argparse.Namespace) -> dict[str, Any]:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    shares: list[int] = []
    make = worker_datasets(cc, args, shares)
    dist = strategy.distribute_datasets_from_function(lambda ctx: make(ctx).batch(args.batch))
    global_batch = args.batch * strategy.num_replicas_in_sync
    step = train_step(strategy, summed_weights(strategy), global_batch, dist.element_spec)
    return {"shares": shares, "epochs": run_epochs(strategy, dist, step)}


def multi_worker_fit(cc: CacheClient, args: argparse.Namespace) -> dict[str, Any]:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    shares: list[int] = []
    make = worker_datasets(cc, args, shares)
    produced: list[int] = []

    def record(i: np.int64) -> np.int64:
        produced.append(int(i))
        return i

    def to_example(e: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        i = tf.ensure_shape(tf.numpy_function(record, [e["id"]], tf.int64), [])
        return e["x"], tf.cast(i % 2, tf.float32)[None]

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # fit keeps one iterator across epochs when steps_per_epoch is given; each
        # iteration of repeat() reads the cache's next epoch
        return make(ctx).repeat().map(to_example).batch(args.batch, drop_remainder=True)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    steps = (args.elements // strategy.num_replicas_in_sync) // args.batch
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    history = model.fit(dist, epochs=EPOCHS, steps_per_epoch=steps, verbose=0)
    return {
        "keras": tf.keras.__name__,
        "shares": shares,
        "steps": steps,
        "produced": produced,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
    }


def mirrored(cc: CacheClient, args: argparse.Namespace) -> dict[str, Any]:
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ran = [0]

    def count(i: np.int64) -> np.int64:
        ran[0] += 1
        return i

    def element(i: tf.Tensor) -> dict[str, tf.Tensor]:
        i = tf.ensure_shape(tf.numpy_function(count, [i], tf.int64, stateful=True), [])
        return {"id": i, "x": features(i)}

    source = tf.data.Dataset.range(args.elements).map(element)
    dist = strategy.experimental_distribute_dataset(cc.cache(source, args.name).batch(args.batch))
    step = train_step(strategy, summed_weights(strategy), args.batch, dist.element_spec)

    def after_epoch() -> dict[str, Any]:
        info = cc.info(args.name)
        return {
            "source_elements_run": ran[0],
            "state": info.state,
            "num_elements": info.num_elements,
        }

    return {
        "replicas": strategy.num_replicas_in_sync,
        "epochs": run_epochs(strategy, dist, step, after_epoch),
    }


MODES = {"loop": multi_worker_loop, "fit": multi_worker_fit, "mirrored": mirrored}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("target")
    parser.add_argument("name")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--elements", type=int, required=True)
    args = parser.parse_args()
    with CacheClient(args.target) as cc:
        result = MODES[args.mode](cc, args)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.rename(args.out)  # the test reads a complete file or none


if __name__ == "__main__":
    main()
