"""client/format/store.py's ShardWriter: syncing on its way, so that a commit waits little, and
failing cleanly on a full disk."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lmdb
import pytest

from client.format import store
from client.format.store import ShardWriter


class _CountingEnv:
    """A shard's real LMDB environment, counting its sync() calls."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.syncs = 0

    def sync(self, force: bool) -> None:
        self.syncs += 1
        self._env.sync(force)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def test_a_shard_is_synced_every_sync_every_bytes_and_once_more_at_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "SYNC_EVERY_BYTES", 10_000)
    writer = ShardWriter(tmp_path / "shard-00000", 1 << 20)
    env = writer._env = _CountingEnv(writer._env)  # type: ignore[assignment]
    values = [bytes([i]) * 4000 for i in range(7)]
    for i in range(0, 7, 2):
        writer.append(values[i : i + 2], 8000)
    assert env.syncs == 2  # after 16,000 and 32,000 stored bytes: not after 8,000 or 24,000
    writer.commit()
    assert env.syncs == 3
    assert writer.num_records == 7 and writer.stored_bytes == 28_000
    env = lmdb.open(str(tmp_path / "shard-00000"), readonly=True, lock=False)
    with env.begin() as txn:
        assert [bytes(v) for _, v in txn.cursor()] == values
    env.close()


def test_a_shard_opened_on_a_full_disk_raises_disk_full_instead_of_dying_by_sigbus(
    small_disk: Path,
) -> None:
    # LMDB writes its lock table through an mmap as it opens: on a full tmpfs that write is
    # SIGBUS, so the shard is opened in a child process and its exit status checked.
    with open(small_disk / "fill", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 20))
    assert shutil.disk_usage(small_disk).free < 4096
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from client.format.store import ShardWriter
        from client.wire.status import DiskFull
        try:
            writer = ShardWriter(Path({str(small_disk / "shard-00000")!r}), 1 << 20)
            writer.append([b"x" * 100_000], 100_000)
            writer.commit()
        except DiskFull as exc:
            print("DiskFull:", exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr}"
    assert "DiskFull: disk full under" in result.stdout, result.stdout + result.stderr
