"""The training loop's input stall: how long it asked for its next element before it was
ready, timed at the top of its pipeline (:func:`timed`, ``cc.timed(ds)``), and a Keras
callback that reports the share of each epoch it waited.

The callback's figure is :class:`client.InputStall`'s (client/observe/report.py): the seconds
the loop waited in the datasets ``cc.timed()`` wraps, over the epoch's wall time. It goes
into the epoch's ``logs`` as ``input_stall`` (History, CSVLogger, and a TensorBoard callback
placed after this one show it), to the ``client`` logger, and, with ``log_dir``, to
TensorBoard as the scalar ``input_stall`` per epoch (and ``batch_input_stall`` every
``every_n_batches`` batches) under ``log_dir/train``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import map_op

from client.observe.report import InputStall, timing

#: A wait is sent to Python once the waits not yet sent add up to this many seconds, or
#: FLUSH_SECONDS after the last was sent: a Python call (a numpy_function, ~0.2 ms) per
#: element would cost a loop of small elements more than the figure is worth. A loop that
#: waits ~1 ms a batch sends once in ~20 batches; an epoch's figure may leave its last
#: waits under this sum to the next epoch's.
FLUSH_WAIT = 20e-3
FLUSH_SECONDS = 1.0

log = logging.getLogger("client")
_SCALAR = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
)


def timed(ds: tf.data.Dataset, stalled: Callable[[float], None]) -> tf.data.Dataset:
    """ds, its consumer's waits for each element passed to stalled (seconds, summed).

    zip asks its inputs in order, in the consumer's thread: the first input, a sequential
    map, stamps the ask (tf.timestamp) just before zip waits on ds; the scan after it stamps
    the element's arrival and keeps the waits not yet sent in its state (saved with the
    iterator). tf.timestamp is a stateful op, so the dataset saves with the external state
    policy IGNORE; and tf.data may not put a prefetch after the scan (inject_prefetch), which
    would time its own thread instead of the loop's (docs/design.md, "The input stall").
    """
    timing()

    def sent(seconds: np.float64) -> np.float64:
        stalled(float(seconds))
        return np.float64(0.0)

    # on the consumer's thread. Not Dataset.counter(): that is a scan of its own, several
    # times the cost of the rest of the ask (docs/benchmarks.md, "What observing a read costs")
    asks = map_op._MapDataset(
        tf.data.Dataset.from_tensors(np.int64(0)).repeat(),
        lambda _: tf.timestamp(),
        use_inter_op_parallelism=False,
    )

    @tf.autograph.experimental.do_not_convert
    def arrived(
        state: tuple[tf.Tensor, tf.Tensor], ask_element: tuple[tf.Tensor, Any]
    ) -> tuple[tuple[tf.Tensor, tf.Tensor], Any]:
        waited, last = state
        asked, element = ask_element
        now = tf.timestamp()
        waited += now - asked
        send = tf.logical_or(waited >= FLUSH_WAIT, now - last >= FLUSH_SECONDS)
        state = tf.cond(
            send,
            lambda: (tf.numpy_function(sent, [waited], tf.float64), now),
            lambda: (waited, last),
        )
        return state, element

    zero = tf.constant(0.0, tf.float64)
    out = tf.data.Dataset.zip((asks, ds)).scan((zero, zero), arrived)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return out.with_options(options)


class InputStallCallback(tf.keras.callbacks.Callback):
    """``model.fit(cc.timed(ds), callbacks=[client.InputStallCallback(log_dir)])``: the
    share of each epoch the loop waited on its input, in logs["input_stall"] and TensorBoard."""

    def __init__(
        self, log_dir: str | os.PathLike[str] | None = None, every_n_batches: int = 0
    ) -> None:
        super().__init__()
        self._log_dir = os.fspath(log_dir) if log_dir is not None else None
        self._every = every_n_batches
        self._epoch, self._batches = InputStall(), InputStall()
        self._writer: Any = None
        self._batch_step = 0
        self._warned = False

    def _scalar(self, name: str, value: float, step: int) -> None:
        if self._log_dir is None:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self._log_dir, "train"))
        with self._writer.as_default():  # what tensorboard's tf.summary.scalar writes,
            # without needing tensorboard installed in the training process
            tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_SCALAR)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch.lap()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_step += 1
        if self._every and self._batch_step % self._every == 0:
            self._scalar("batch_input_stall", self._batches.fraction(), self._batch_step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        stall = self._epoch.fraction()
        if not self._epoch.measured and not self._warned:
            self._warned = True
            log.warning(
                "shardcache: no dataset in this process times its input stall, so "
                "InputStallCallback reports 0; pass model.fit() cc.timed(ds)"
            )
        if logs is not None:
            logs["input_stall"] = stall
        log.info("epoch %d: waited on input %.1f%% of the time", epoch + 1, 100 * stall)
        self._scalar("input_stall", stall, epoch)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.flush()
