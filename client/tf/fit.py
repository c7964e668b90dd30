"""Keras's data position: where an interrupted ``fit`` left its cache epoch, read back by
``cc.dataset(..., resume_from=backup_dir, batch_size=B)``.

Keras's ``BackupAndRestore`` saves the weights, the optimizer and the epoch, and
restarts the interrupted epoch from its first batch. The position it needs is
the number of batches the backed-up weights have trained in that epoch, taken
at the moment of the backup:

* tf-keras (``TF_USE_LEGACY_KERAS=1``, MultiWorkerMirroredStrategy) saves it
  itself, as the variables ``ckpt_saved_epoch`` and ``ckpt_saved_batch`` of the
  checkpoint under ``BACKUP_DIR/chief``, and its ``fit`` continues the
  interrupted epoch's step count from there.
* Keras 3 keeps only the epoch. :class:`BackupAndRestore` (Keras's, plus the
  position) writes ``BACKUP_DIR/shardcache_position.json`` right after each
  backup, counting batches from the epoch's start across restarts: Keras 3
  numbers a resumed epoch's batches from 0 again. It also records the epoch
  a backup is taken in: Keras's own records the last one ended, so a backup
  in the first epoch of a resumed fit said 0.

A resumed dataset declares the cardinality of a whole epoch, so that Keras
keeps each epoch's step count; its first iteration holds only the epoch's
unread part, and Keras 3 ends that epoch when it runs out (its "ran out of
data" warning is silenced for that epoch).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any, cast

import tensorflow as tf

from client.errors import InvalidArgumentError

log = logging.getLogger("client")

#: The data position Keras 3's backups get beside their weights.
POSITION_FILE = "shardcache_position.json"
#: Keras 3's warning when a resumed epoch's data ends before its step count.
_RAN_OUT = "Your input ran out of data"


def legacy_keras() -> bool:
    """Whether tf.keras is tf-keras (TF_USE_LEGACY_KERAS=1), not Keras 3."""
    return tf.keras.__name__.startswith("tf_keras")


def position(backup_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(epoch, batches of it trained) at the latest backup in backup_dir; None: no backup.

    The batch count may be the whole epoch's (a backup after its last batch):
    the caller moves on to the next epoch then.
    """
    backup = Path(backup_dir)
    saved = backup / POSITION_FILE
    if saved.exists():
        try:
            record = json.loads(saved.read_text())
            return int(record["epoch"]), int(record["batches"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(
                f"{saved} is not a data position written by client.keras.BackupAndRestore "
                f"({exc}); delete it to start the interrupted epoch from its first batch"
            ) from exc
    latest = tf.train.latest_checkpoint(str(backup / "chief"))
    if latest is None:
        return None
    reader = tf.train.load_checkpoint(latest)
    names = reader.get_variable_to_shape_map()
    keys = {k.split("/")[0]: k for k in names if k.endswith("VARIABLE_VALUE")}
    if "ckpt_saved_epoch" not in keys or "ckpt_saved_batch" not in keys:
        raise InvalidArgumentError(
            f"{latest} is not a tf-keras BackupAndRestore backup (no ckpt_saved_epoch and "
            "ckpt_saved_batch); pass the backup_dir given to BackupAndRestore"
        )
    epoch = int(reader.get_tensor(keys["ckpt_saved_epoch"]))
    batch = int(reader.get_tensor(keys["ckpt_saved_batch"]))
    if epoch < 0:
        return None
    if batch < 0:  # save_freq="epoch": saved at the end of epoch
        return epoch + 1, 0
    return epoch, batch + 1


def resume_at(
    backup_dir: str | os.PathLike[str], batch_size: int | None, share: int
) -> tuple[int, int] | None:
    """(epoch, start) of the element after the backed-up batches of this worker's share of
    share elements an epoch, in batches of batch_size; None: no backup."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(
            f"resume_from needs batch_size=, the batch size of fit's steps on this worker "
            f"(a positive integer), got {batch_size!r}"
        )
    found = position(backup_dir)
    if found is None:
        return None
    epoch, batches = found
    start = batches * batch_size
    if start >= share:
        return epoch + 1, 0
    log.info(
        "resuming epoch %d at element %d of %d (batch %d), from %s",
        epoch,
        start,
        share,
        batches,
        backup_dir,
    )
    return epoch, start


def _keras3_backup() -> type:
    import keras

    class KerasBackupAndRestore(keras.callbacks.BackupAndRestore):  # type: ignore[misc]
        __doc__ = BACKUP_DOC

        def __init__(
            self,
            backup_dir: str,
            save_freq: str | int = "epoch",
            double_checkpoint: bool = False,
            delete_checkpoint: bool = True,
        ) -> None:
            super().__init__(
                backup_dir,
                save_freq=save_freq,
                double_checkpoint=double_checkpoint,
                delete_checkpoint=delete_checkpoint,
            )
            self._position_path = Path(backup_dir) / POSITION_FILE
            self._resumed: tuple[int, int] | None = None
            self._epoch, self._batches, self._offset = 0, 0, 0
            self._filter: Any = None

        def on_train_begin(self, logs: Any = None) -> None:
            super().on_train_begin(logs)
            self._resumed = position(self.backup_dir) if self._position_path.exists() else None

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            # Keras's sets its epoch at an epoch's end only: a backup in the first epoch of
            # a resumed fit would record epoch 0, and the next run start over from there
            self._current_epoch = epoch
            self._epoch, self._batches = epoch, 0
            resumed = self._resumed is not None and self._resumed[0] == epoch
            self._offset = self._resumed[1] if resumed and self._resumed else 0
            if self._offset:  # the epoch's data ends before Keras's step count
                warnings.filterwarnings("ignore", message=_RAN_OUT)
                self._filter = warnings.filters[0]
            super().on_epoch_begin(epoch, logs)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._batches = self._offset + batch + 1
            super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self._filter is not None:
                filters = cast(list[Any], warnings.filters)  # a list, typed as a Sequence
                if self._filter in filters:
                    filters.remove(self._filter)
                self._filter = None
            self._epoch, self._batches, self._offset = epoch + 1, 0, 0
            super().on_epoch_end(epoch, logs)

        def _save_model(self) -> None:
            super()._save_model()
            tmp = self._position_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"epoch": self._epoch, "batches": self._batches}))
            os.replace(tmp, self._position_path)

    return KerasBackupAndRestore


BACKUP_DOC = """Keras's BackupAndRestore, which also saves the data position.

    Use it in place of ``keras.callbacks.BackupAndRestore`` (same arguments)
    and read the cache with ``cc.dataset(name, ..., resume_from=backup_dir,
    batch_size=B)``: an interrupted ``fit`` run again continues the interrupted
    epoch with its next unseen batch. Under tf-keras (``TF_USE_LEGACY_KERAS=1``)
    it is tf-keras's own, which saves the position itself.
    """


def backup_and_restore_class() -> type:
    """The BackupAndRestore callback for this process's tf.keras."""
    if legacy_keras():
        return tf.keras.callbacks.BackupAndRestore  # type: ignore[no-any-return]
    return _keras3_backup()
