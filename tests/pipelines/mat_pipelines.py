"""Entry points the materialization tests run on the daemon (`serve --pythonpath` here).

Each is fn(shard_index, num_shards) -> tf.data.Dataset, as a user's would be.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

#: When set, shards >= 2 stop after GATED_AFTER elements until this file exists.
GATE_ENV = "SC_TEST_GATE"
GATED_AFTER = 5
NOT_CALLABLE = 42


def _held_at(ds: tf.data.Dataset, on_hold: Callable[[], None], release: str) -> tf.data.Dataset:
    """ds, but after GATED_AFTER elements it calls on_hold() and waits (up to 300 s) for the
    file release to exist."""

    def wait(position: np.int64) -> np.int64:
        if position == GATED_AFTER:
            on_hold()
            deadline = time.monotonic() + 300
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.05)
        return position

    def hold(position: tf.Tensor, element: dict) -> dict:
        done = tf.numpy_function(wait, [position], tf.int64)
        with tf.control_dependencies([done]):
            return {k: tf.identity(v) for k, v in element.items()}

    return ds.enumerate().map(hold)


def records(shard: int, num_shards: int) -> tf.data.Dataset:
    """Shard s holds 20 + s elements: an id, a variable-length vector and a string."""
    first = shard * 1000
    ids = tf.data.Dataset.range(first, first + 20 + shard)
    return ids.map(
        lambda i: {
            "id": i,
            "vec": tf.fill([tf.cast(i % 7, tf.int32)], tf.cast(i, tf.float32)),
            "tag": tf.strings.as_string(i * 3),
        }
    )


def gated(shard: int, num_shards: int) -> tf.data.Dataset:
    """records(), but shards >= 2 wait for the gate file part way (a crash window)."""
    ds = records(shard, num_shards)
    gate = os.environ.get(GATE_ENV)
    if shard < 2 or not gate:
        return ds
    return _held_at(ds, lambda: None, gate)


def raises(shard: int, num_shards: int) -> tf.data.Dataset:
    if shard == 1:
        raise FileNotFoundError("source file /data/part-00001.tfrecord is missing")
    return tf.data.Dataset.range(10)


def fails_while_reading(shard: int, num_shards: int) -> tf.data.Dataset:
    def check(x: tf.Tensor) -> tf.Tensor:
        ok = tf.debugging.assert_less(x, tf.constant(5, tf.int64), message="label out of range")
        with tf.control_dependencies([ok]):
            return tf.identity(x)

    ds = tf.data.Dataset.range(10)
    return ds.map(check) if shard == 1 else ds


def not_a_dataset(shard: int, num_shards: int) -> list[int]:
    return [shard, num_shards]


def mixed_specs(shard: int, num_shards: int) -> tf.data.Dataset:
    ds = tf.data.Dataset.range(10)
    return ds.map(lambda x: tf.cast(x, tf.float32)) if shard == 1 else ds


def big(shard: int, num_shards: int) -> tf.data.Dataset:
    """8 MiB of incompressible bytes per shard (fills a small disk)."""
    rng = np.random.default_rng(shard)
    return tf.data.Dataset.from_tensor_slices(
        rng.integers(0, 256, size=(64, 128 << 10), dtype=np.uint8)
    )


def infinite(shard: int, num_shards: int) -> tf.data.Dataset:
    return tf.data.Dataset.range(3).repeat()


def fixed(shard: int, num_shards: int) -> tf.data.Dataset:
    """Shard s holds 130 + s ~1 KB fixed-shape elements: blocks of 63, the last one short."""
    first = shard * 1000
    ids = tf.data.Dataset.range(first, first + 130 + shard)
    return ids.map(lambda i: {"id": i, "x": tf.fill([256], tf.cast(i, tf.float32))})


def kills_its_process_group(shard: int, num_shards: int) -> tf.data.Dataset:
    """What a hostile or careless pipeline does: SIGKILL to every process of its group."""
    os.killpg(os.getpgid(0), signal.SIGKILL)
    return tf.data.Dataset.range(3)


def kills_process_group_zero(shard: int, num_shards: int) -> tf.data.Dataset:
    """os.kill(0, ...) signals the caller's own process group (finding 3 used os:kill)."""
    os.kill(0, signal.SIGKILL)
    return tf.data.Dataset.range(3)


def reports_its_session(shard: int, num_shards: int) -> tf.data.Dataset:
    """One element: the worker's pid, session, process group and parent."""
    return tf.data.Dataset.from_tensors(
        tf.constant([os.getpid(), os.getsid(0), os.getpgid(0), os.getppid()], tf.int64)
    )


#: A directory: shards listed in HOLD_SHARDS_ENV stop after GATED_AFTER elements, create
#: <dir>/holding-<shard> and wait for <dir>/release (an Indexed Job index caught mid-shard).
HOLD_DIR_ENV = "SC_TEST_HOLD_DIR"
HOLD_SHARDS_ENV = "SC_TEST_HOLD_SHARDS"


def held(shard: int, num_shards: int) -> tf.data.Dataset:
    """records(), but the shards named in $SC_TEST_HOLD_SHARDS hold part way."""
    ds = records(shard, num_shards)
    hold_dir = os.environ.get(HOLD_DIR_ENV)
    shards = {int(s) for s in os.environ.get(HOLD_SHARDS_ENV, "").split(",") if s}
    if not hold_dir or shard not in shards:
        return ds

    def holding() -> None:
        open(os.path.join(hold_dir, f"holding-{shard}"), "w").close()

    return _held_at(ds, holding, os.path.join(hold_dir, "release"))
