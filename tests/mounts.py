"""Real filesystems for fault tests: a small tmpfs fills up, a read-only one refuses writes."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(options: str) -> Iterator[Path]:
    """A tmpfs mounted with options ("size=24m", "ro,size=1m"); skips the test unless root."""
    mount = Path(tempfile.mkdtemp(prefix="sc-tmpfs-", dir="/tmp"))
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        shutil.rmtree(mount, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)
