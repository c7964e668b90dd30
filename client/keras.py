"""Keras callbacks for fits over caches; importing it imports TensorFlow.

    from client.keras import BackupAndRestore
    backup = BackupAndRestore(backup_dir, save_freq=100)
    ds = cc.dataset("train", shuffle=True, seed=7, resume_from=backup_dir, batch_size=B)
    model.fit(ds.batch(B), epochs=10, callbacks=[backup])

A fit run again after an interruption continues its interrupted epoch at the
next unseen batch (docs/resume.md, "Keras fit").
"""

from client.tf.fit import backup_and_restore_class

#: Keras's BackupAndRestore, plus the data position (client/tf/fit.py); under tf-keras
#: (TF_USE_LEGACY_KERAS=1) tf-keras's own, which saves the position itself.
BackupAndRestore = backup_and_restore_class()

__all__ = ["BackupAndRestore"]
