"""The training process's own view of input stall: cc.timed(), a Keras callback and a meter
for custom loops, over real reads; the callback's TensorBoard event files read back."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import client
from client import CacheClient, InputStall

tf = pytest.importorskip("tensorflow")


def source() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 8)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))


def scalars(log_dir: Path, tag: str) -> dict[int, float]:
    """{step: value} of tag in the TensorBoard event files under log_dir."""
    found = {}
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return found


def test_keras_fit_reports_the_input_stall_per_epoch_to_logs_and_tensorboard(
    daemon, name, tmp_path
) -> None:
    with CacheClient(daemon.unix_target, report=False) as cc:
        list(cc.cache(source(), name))  # written
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        history = model.fit(
            cc.timed(cc.dataset(name).batch(32)),
            epochs=2,
            verbose=0,
            shuffle=False,
            callbacks=[client.InputStallCallback(tmp_path, every_n_batches=8)],
        )
    stall = history.history["input_stall"]
    assert len(stall) == 2 and all(0 <= s <= 1 for s in stall)
    assert stall[0] > 0  # the epoch's first batch is asked for before it is ready
    written = scalars(tmp_path, "input_stall")
    assert sorted(written) == [0, 1]
    assert [round(v, 5) for v in written.values()] == [round(s, 5) for s in stall]
    assert sorted(scalars(tmp_path, "batch_input_stall")) == [8, 16, 24, 32]


def test_a_custom_loop_times_its_own_waits_with_timed(daemon, name) -> None:
    ticks = iter(range(1000))
    stall = InputStall(clock=lambda: float(next(ticks)))  # every clock reading one second on
    with CacheClient(daemon.unix_target) as cc:
        list(cc.cache(source(), name))
        stall.lap()
        batches = sum(1 for _ in stall.timed(cc.dataset(name).batch(64)))
        waited, wall = stall.lap()
    # each next() (8 batches and the StopIteration) read the clock twice: 1 s each
    assert batches == 8 and waited == 9 and wall == 2 * 9 + 1


def gated(ds: tf.data.Dataset, at: int, gate: threading.Event) -> tf.data.Dataset:
    """ds, its element at index `at` held back until gate is set."""

    def hold(i: np.int64) -> np.int64:
        if i == at:
            assert gate.wait(30)
        return i

    def held(i: tf.Tensor, element: Any) -> Any:
        with tf.control_dependencies([tf.numpy_function(hold, [i], tf.int64)]):
            return tf.nest.map_structure(tf.identity, element)

    return ds.enumerate().map(held)


def test_the_stall_is_the_loops_own_wait_for_its_next_element(daemon, name) -> None:
    """A batch held back while the loop asks for it is waited on; one held back while a
    prefetch keeps the loop supplied is not (the margins are wide: no timing of the code)."""
    hold = 0.4
    with CacheClient(daemon.unix_target, report=False) as cc:
        list(cc.cache(source(), name))
        stall = InputStall()
        gate = threading.Event()
        ds = cc.timed(gated(cc.dataset(name).batch(64), 2, gate))
        it = iter(ds)
        next(it), next(it)
        opens = time.monotonic() + hold
        threading.Timer(hold, gate.set).start()
        stall.lap()
        asked = time.monotonic()
        next(it)  # the loop waits on batch 2 until the gate opens
        assert stall.lap()[0] >= opens - asked - 0.01  # 10 ms for the two clocks' reads
        gate = threading.Event()
        threading.Timer(hold, gate.set).start()
        ahead = cc.timed(gated(cc.dataset(name).batch(64), 2, gate).prefetch(8))
        it = iter(ahead)
        stall.lap()
        time.sleep(2 * hold)  # the loop's own work: the prefetch gets batch 2 meanwhile
        assert sum(1 for _ in it) == 8
        waited, wall = stall.lap()
        assert waited < hold <= wall


def test_a_timed_dataset_saves_and_restores(daemon, name, tmp_path) -> None:
    """Its timestamps are stateful ops: the dataset ignores external state, and the restored
    iterator goes on exactly (restores across epochs, in new processes: test_checkpoints.py)."""
    with CacheClient(daemon.unix_target, report=False) as cc:
        list(cc.cache(source(), name))
        ds = cc.timed(cc.dataset(name, shuffle=True, seed=3).batch(100))
        it = iter(ds)
        for _ in range(3):
            next(it)
        path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
        here = [batch[1].numpy().tolist() for batch in it]  # the epoch's rest: 100, 100, 12
        restored = iter(ds)
        tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
        assert [batch[1].numpy().tolist() for batch in restored] == here
        assert [len(b) for b in here] == [100, 100, 12]
