"""A Keras callback that reports how much of each epoch the training loop waited on input.

The figure is :class:`client.InputStall`'s (client/read/report.py): the seconds this
process's shardcache reads kept their consumer waiting for a chunk, over the epoch's wall
time; reads time it where their CacheClient has ``time_stall=True``. It goes into the
epoch's ``logs`` as ``input_stall`` (History, CSVLogger, and a TensorBoard callback placed
after this one show it), to the ``client`` logger, and, with ``log_dir``, to TensorBoard as
the scalar ``input_stall`` per epoch (and ``batch_input_stall`` every ``every_n_batches``
batches) under ``log_dir/train``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import tensorflow as tf

from client.read.report import InputStall

log = logging.getLogger("client")
_SCALAR = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"))


class InputStallCallback(tf.keras.callbacks.Callback):
    """``model.fit(..., callbacks=[client.InputStallCallback(log_dir)])``: the share of each
    epoch the loop waited on its shardcache input, in logs["input_stall"] and TensorBoard."""

    def __init__(self, log_dir: str | os.PathLike[str] | None = None,
                 every_n_batches: int = 0) -> None:
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
            tf.summary.write(name, tf.constant(value, tf.float32), step=step,
                             metadata=_SCALAR)

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
            log.warning("shardcache: no read in this process times its input stall, so "
                        "InputStallCallback reports 0; make the CacheClient with "
                        "time_stall=True")
        if logs is not None:
            logs["input_stall"] = stall
        log.info("epoch %d: waited on input %.1f%% of the time", epoch + 1, 100 * stall)
        self._scalar("input_stall", stall, epoch)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.flush()
