"""The read-ahead a shard stream asks the kernel for: windows that stay ahead of the cursor."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from cacheserver import store
from cacheserver.store import ReaderPool, ShardWriter

MiB = 1 << 20


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (offset, length) of every WILLNEED advice, and still give it to the kernel."""
    calls: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            calls.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(store.os, "posix_fadvise", record)
    return calls


def _shard(tmp_path: Path, records: int, size: int) -> Path:
    writer = ShardWriter(tmp_path / "shard-00000", records * size)
    for i in range(records):
        writer.append([bytes([i % 251]) * size], size)
    writer.commit()
    return tmp_path / "shard-00000"


def test_a_sequential_stream_is_advised_window_by_window_ahead_of_its_cursor(
        tmp_path: Path, advised: list[tuple[int, int]]) -> None:
    path = _shard(tmp_path, records=200, size=512 << 10)  # ~100 MiB: several windows
    got = sum(len(lengths) // 4 for _, lengths, _ in
              ReaderPool().read_chunks(path, 0, 200, 1 << 20))
    assert got == 200
    file_bytes = (path / "data.mdb").stat().st_size
    assert advised[0][0] == 0
    # contiguous, never re-advising a byte, covering the file to its end
    for (offset, length), (next_offset, _) in itertools.pairwise(advised):
        assert next_offset == offset + length
    assert advised[-1][0] + advised[-1][1] == file_bytes
    assert all(length <= 32 * MiB for _, length in advised)


def test_a_stream_resumed_mid_shard_starts_reading_ahead_where_it_resumes(
        tmp_path: Path, advised: list[tuple[int, int]]) -> None:
    path = _shard(tmp_path, records=200, size=512 << 10)
    list(ReaderPool().read_chunks(path, 150, 200, 1 << 20))
    file_bytes = (path / "data.mdb").stat().st_size
    assert advised[0][0] >= file_bytes * 0.7  # not from the start of the file
