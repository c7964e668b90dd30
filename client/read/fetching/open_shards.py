"""The shard files a direct pass holds open: all of them, or a bounded set opened on demand.

Each open shard costs the process a file descriptor and a memory map (LMDB maps
its data.mdb). A pass over a cache of more shards than the process may hold
(``ulimit -n``, ``vm.max_map_count``) used to fail at its start, on the file
past the limit, with "Too many open files". :func:`open_shards` decides, once
per pass: while every process-wide pass together holds at most
:func:`budget` shards, the pass opens all of its shards at once and reads one
snapshot of them (docs/direct.md); past that, it notes each shard file's inode
now and opens the shards as it reaches them, at most :data:`LAZY_OPEN` at a
time (least recently used closed first). A shard opened later that is no longer
the file the lease named (the cache was deleted, or deleted and rebuilt,
meanwhile) ends the pass with an error saying so, instead of mixing two caches.
Values are never handed out as views into a lazily opened shard's map (it may be
closed once the read that took them is done).
"""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from client.errors import DataLossError

#: Shards a lazily opening pass holds open at most (a reader walks a few at a time).
LAZY_OPEN = 64
_lock = threading.Lock()
_held = 0  # shards held open by eager passes of this process


def budget() -> int:
    """Shards this process's direct passes may hold open together: a quarter of its fd limit
    and a sixteenth of vm.max_map_count (TensorFlow, gRPC and threads take their own), at
    least LAZY_OPEN."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = soft // 4 if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            maps = int(f.read()) // 16
    except (OSError, ValueError):
        maps = 65530 // 16
    return max(LAZY_OPEN, min(files, maps))


def _inode(path: Path) -> int:
    try:
        return os.stat(path / "data.mdb").st_ino
    except FileNotFoundError:
        return -1


class OpenShards:
    """The shards of one pass: using(shard) gives a held environment while the block runs;
    close() releases them all."""

    def __init__(self, pool: Any, paths: Sequence[Path], wanted: Sequence[int], cache: str) -> None:
        global _held
        self._pool = pool
        self._paths = paths
        self._wanted = frozenset(wanted)
        self._cache = cache
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[int, Any] = collections.OrderedDict()
        with _lock:
            self.lazy = _held + len(self._wanted) > budget()
            self._counted = 0 if self.lazy else len(self._wanted)
            _held += self._counted
        self._inodes: dict[int, int] = {}
        if self.lazy:  # no file opened: each one's identity, to check it when it is opened
            self._inodes = {i: _inode(paths[i]) for i in self._wanted}
            return
        try:
            for index in sorted(self._wanted):
                self._open[index] = pool.hold(paths[index])  # DataLoss for a damaged file
        except BaseException:
            self.close()
            raise

    def holds(self, shard: int) -> bool:
        return shard in self._wanted

    @contextlib.contextmanager
    def using(self, shard: int) -> Iterator[Any]:
        """The shard's environment, held (retained) until the block ends."""
        path = self._paths[shard]
        with self._lock:
            env = self._open.get(shard)
            if env is None:
                env = self._open[shard] = self._opened(shard)
                while len(self._open) > LAZY_OPEN:
                    old, old_env = self._open.popitem(last=False)
                    self._pool.release(self._paths[old], old_env)  # closes once unused
            else:
                self._open.move_to_end(shard)
            self._pool.retain(env)
        try:
            yield env
        finally:
            self._pool.release(path, env)

    def _opened(self, shard: int) -> Any:
        """Open a shard of a lazy pass: the file the lease named, or an error."""
        path = self._paths[shard]
        if _inode(path) == self._inodes.get(shard, -1) != -1:
            env = self._pool.hold(path)
            if env.inode == self._inodes[shard]:
                return env
            self._pool.release(path, env)
        raise DataLossError(
            f"cache {self._cache!r}: shard {shard} at {path} was deleted or replaced since "
            "this pass began (the cache was deleted meanwhile); read the cache again"
        )

    def close(self) -> None:
        global _held
        with self._lock:
            envs, self._open = list(self._open.items()), collections.OrderedDict()
        for shard, env in envs:
            self._pool.release(self._paths[shard], env)
        with _lock:
            _held -= self._counted
            self._counted = 0
