"""A real full disk: a small tmpfs under the daemon's data directory."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from daemon import Daemon

tf = pytest.importorskip("tensorflow")


@pytest.fixture
def small_disk() -> Iterator[Path]:
    mount = Path(tempfile.mkdtemp(prefix="sc-tmpfs-", dir="/tmp"))
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(mount, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def test_a_full_disk_fails_the_write_keeps_training_and_loses_nothing(
        small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    from client import CacheClient

    daemon = Daemon(data_dir=small_disk / "data").start()
    try:
        with CacheClient(daemon.unix_target) as cc:
            small = tf.data.Dataset.range(100)
            assert len(list(cc.cache(small, name="small"))) == 100
            free_before = _free_bytes(small_disk)
            rng = np.random.default_rng(0)
            big = tf.data.Dataset.from_tensor_slices(
                rng.integers(0, 256, size=(400, 128 << 10), dtype=np.uint8))  # 50 MiB
            with caplog.at_level(logging.WARNING, logger="client"):
                seen = sum(1 for _ in cc.cache(big, name="big"))
            assert seen == 400, "the epoch must go on from the source pipeline"
            assert any("disk full" in r.getMessage() for r in caplog.records), caplog.text
            assert [c.name for c in cc.list()] == ["small"]
            assert _free_bytes(small_disk) >= free_before - (1 << 20), "space not released"
            assert [int(x) for x in cc.dataset("small")] == list(range(100))
        assert "disk full" in daemon.log()
    finally:
        daemon.close()
