"""client/read/fetching/open_shards.py: a direct pass over more shards than the process may
hold open opens them as it goes, a bounded set at a time, and notices a replaced file."""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.errors import DataLossError
from client.format.store import ReaderPool, ShardGetter, ShardWriter
from client.read.fetching import open_shards
from client.read.fetching.open_shards import LAZY_OPEN, OpenShards


def _write(path: Path, value: bytes) -> None:
    writer = ShardWriter(path, 1 << 16)
    writer.append([value], len(value))
    writer.commit()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def low_file_limit() -> Iterator[int]:
    """This process's soft fd limit lowered to 300 more than it has open (the hard limit
    stays, so it is restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, _open_fds() + 300)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        yield low
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def pool() -> ReaderPool:
    pool = ReaderPool()
    pool.MAX_IDLE = 0  # as the client's: closed when released
    return pool


def _shards(tmp_path: Path, n: int) -> list[Path]:
    paths = [tmp_path / f"shard-{i:05d}" for i in range(n)]
    for i, path in enumerate(paths):
        _write(path, i.to_bytes(8, "big"))
    return paths


def _read(held: OpenShards, paths: list[Path], shard: int) -> int:
    with held.using(shard) as env:
        (value,) = ShardGetter(env, paths[shard]).get_many((0).to_bytes(8, "big"))
        return int.from_bytes(value, "big")


def test_a_pass_over_more_shards_than_its_budget_reads_each_with_a_bounded_set_open(
    tmp_path: Path, pool: ReaderPool, low_file_limit: int
) -> None:
    n = open_shards.budget() + 20
    paths = _shards(tmp_path, n)
    before = _open_fds()
    held = OpenShards(pool, paths, range(n), "c")
    assert held.lazy
    assert _open_fds() == before  # nothing opened up front
    most = 0
    for shard in [*range(n), *reversed(range(n))]:
        assert _read(held, paths, shard) == shard
        most = max(most, _open_fds() - before)
    assert most <= LAZY_OPEN
    held.close()
    assert _open_fds() == before


def test_a_lazy_pass_refuses_a_shard_deleted_or_rebuilt_since_it_began(
    tmp_path: Path, pool: ReaderPool, low_file_limit: int
) -> None:
    n = open_shards.budget() + 20
    paths = _shards(tmp_path, n)
    held = OpenShards(pool, paths, range(n), "c")
    assert _read(held, paths, 0) == 0
    shutil.rmtree(paths[1])
    shutil.rmtree(paths[2])
    _write(paths[2], b"rebuilt!")  # the same path, another file
    for shard in (1, 2):
        with pytest.raises(DataLossError, match=f"shard {shard} .* deleted or replaced"):
            _read(held, paths, shard)
    assert _read(held, paths, 3) == 3
    held.close()


def test_a_pass_within_the_budget_opens_every_shard_at_once_and_reads_a_deleted_one(
    tmp_path: Path, pool: ReaderPool
) -> None:
    paths = _shards(tmp_path, 3)
    held = OpenShards(pool, paths, [0, 2], "c")
    assert not held.lazy and held.holds(2) and not held.holds(1)
    shutil.rmtree(paths[2])  # the snapshot: the mapped file still reads
    assert _read(held, paths, 2) == 2
    held.close()


def test_the_budget_counts_every_eager_pass_of_the_process(
    tmp_path: Path, pool: ReaderPool, low_file_limit: int
) -> None:
    half = open_shards.budget() // 2 + 1
    paths = _shards(tmp_path, half)
    first = OpenShards(pool, paths, range(half), "a")
    second = OpenShards(pool, paths, range(half), "b")
    assert not first.lazy and second.lazy  # together they would pass the budget
    first.close()
    second.close()
    third = OpenShards(pool, paths, range(half), "c")
    assert not third.lazy  # the first one's shards were handed back
    third.close()
