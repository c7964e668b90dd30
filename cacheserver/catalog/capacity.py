"""Disk capacity: room for writes, least-recently-read eviction, TTL sweeps.

Two limits, both optional: ``max_bytes`` over all caches (committed caches
count their files on disk, writes in progress the record bytes they stored so
far) and ``min_free_bytes`` of free space on the data dir's filesystem. Each
write chunk reserves its bytes before it is stored; when a limit would be
crossed, the least recently read READY cache that is neither pinned nor being
read is evicted, and again, until the chunk fits. When nothing is left to
evict the write fails with CapacityExceeded, naming the numbers, and the
writer's session discards what it stored (its space is released).

Knows nothing of gRPC. The catalog supplies candidates and does the deleting,
through :class:`Evictable`.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from cacheserver.catalog.manifest import CacheRecord
from cacheserver.catalog.retention import Retention, RetentionBook
from client.wire.status import CapacityExceeded

log = logging.getLogger(__name__)


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / (1 << 20):.1f} MiB)"


class Evictable(Protocol):
    """What capacity and the TTL sweeper ask of the caches they keep in bounds (the catalog)."""

    def committed_bytes(self) -> int: ...

    def eviction_candidate(self, exclude: str) -> str | None: ...

    def retained_summary(self) -> str: ...

    def expired(self, now: float) -> list[str]: ...

    def evict(self, name: str, reason: str) -> bool: ...


class Capacity:
    """Reserves room for writes in one data dir, evicting to make it."""

    def __init__(self, data_dir: Path, max_bytes: int = 0, min_free_bytes: int = 0) -> None:
        self.data_dir = data_dir
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self._lock = threading.Lock()
        self._pending: defaultdict[str, int] = defaultdict(int)
        self._catalog: Evictable | None = None

    def attach(self, catalog: Evictable) -> None:
        self._catalog = catalog

    def pending_bytes(self) -> int:
        with self._lock:
            return sum(self._pending.values())

    def in_use(self) -> int:
        """Bytes of committed caches on disk plus what writes in progress stored."""
        assert self._catalog is not None
        return self._catalog.committed_bytes() + self.pending_bytes()

    def release(self, name: str) -> None:
        """A write ended (committed: its files now count as disk_bytes; aborted: deleted)."""
        with self._lock:
            self._pending.pop(name, None)

    def unreserve(self, name: str, nbytes: int) -> None:
        """Give back nbytes of what cache name reserved (a streamed shard's window slot
        freed, cacheserver/catalog/window.py)."""
        with self._lock:
            left = self._pending.get(name, 0) - nbytes
            if left > 0:
                self._pending[name] = left
            else:
                self._pending.pop(name, None)

    def reserve(self, name: str, nbytes: int, written: bool = False, headroom: int = 0) -> None:
        """Make room for nbytes more of cache name, evicting if need be, or raise.

        written: the bytes are on the filesystem already (a same-host writer's files,
        cacheserver/catalog/direct_writes.py), so free space counts them already.
        headroom: room that must stay free beside them (a partially resident cache keeps
        its stream window's, cacheserver/catalog/pulls.py)."""
        assert self._catalog is not None
        if not (self.max_bytes or self.min_free_bytes):
            with self._lock:
                self._pending[name] += nbytes
            return
        with self._lock:  # one reservation at a time: two writers must not both evict
            while True:
                problem = self._shortfall(nbytes + headroom, written)
                if problem is None:
                    self._pending[name] += nbytes
                    return
                victim = self._catalog.eviction_candidate(exclude=name)
                if victim is None:
                    raise CapacityExceeded(
                        f"no room for cache {name!r}: {problem}; nothing is left to evict "
                        f"({self._catalog.retained_summary()}): delete caches (cacheserver "
                        "ls / rm), unpin some, or raise the limit"
                    )
                self._catalog.evict(victim, "capacity")

    def _shortfall(self, nbytes: int, written: bool = False) -> str | None:
        assert self._catalog is not None
        if self.max_bytes:
            in_use = self._catalog.committed_bytes() + sum(self._pending.values())
            if in_use + nbytes > self.max_bytes:
                return (
                    f"the write needs {_size(nbytes)} more, caches use {_size(in_use)} "
                    f"and --max-bytes is {_size(self.max_bytes)}"
                )
        if self.min_free_bytes:
            free = shutil.disk_usage(self.data_dir).free
            if free - (0 if written else nbytes) < self.min_free_bytes:
                return (
                    f"the write needs {_size(nbytes)} more, the data dir's filesystem has "
                    f"{_size(free)} free and --min-free-bytes is {_size(self.min_free_bytes)}"
                )
        return None


class TtlSweeper:
    """A thread deleting caches idle for longer than their TTL, every interval seconds."""

    def __init__(self, catalog: Evictable, interval: float) -> None:
        self._catalog = catalog
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ttl-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def sweep(self) -> list[str]:
        """Delete every expired, unpinned cache nobody reads; returns their names."""
        swept = []
        for name in self._catalog.expired(time.time()):
            if self._catalog.evict(name, "ttl"):
                swept.append(name)
        return swept

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep()
            except Exception:
                log.exception("TTL sweep failed; trying again in %.0fs", self._interval)


#: Below this much free space the data dir's filesystem counts as full.
FULL_BELOW_BYTES = 1 << 20


class DiskWatch:
    """A thread watching the data dir's free space: reads go on when it fills up, writes
    fail with DISK_FULL, and this says so (a log line at each change, the callback, which
    the server turns into the health status of WRITES_HEALTH_SERVICE) until space returns.
    """

    def __init__(
        self, data_dir: Path, on_change: Callable[[bool], None], interval: float = 5.0
    ) -> None:
        self._data_dir = data_dir
        self._on_change = on_change
        self._interval = interval
        self._full: bool | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-watch", daemon=True)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self._data_dir).free

    def check(self) -> bool:
        """Look now; True while the disk is full."""
        free = self.free_bytes()
        full = free < FULL_BELOW_BYTES
        if full != self._full:
            if full:
                log.warning(
                    "disk full under %s (%s free): serving reads of READY caches; "
                    "writes fail with DISK_FULL until space returns (free space or "
                    "delete caches: cacheserver rm NAME)",
                    self._data_dir,
                    _size(free),
                )
            elif self._full:
                log.info(
                    "disk space returned under %s (%s free): writes accepted again",
                    self._data_dir,
                    _size(free),
                )
            self._full = full
            self._on_change(full)
        return full

    def start(self) -> None:
        self.check()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check()
            except OSError as exc:
                log.warning("cannot check free space under %s: %s", self._data_dir, exc)


def _idle_since(record: CacheRecord, value: Retention) -> float:
    return max(record.commit_time, value.last_read_time)


def pick_victim(records: Iterable[CacheRecord], book: RetentionBook, exclude: str) -> str | None:
    """The least recently read READY cache that is neither pinned nor being read."""
    best: tuple[float, str] | None = None
    for r in records:
        if r.state != "READY" or r.name == exclude or book.readers(r.name):
            continue
        value = book.get(r.name)
        if value.pinned:
            continue
        key = (_idle_since(r, value), r.name)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def expired_names(records: Iterable[CacheRecord], book: RetentionBook, now: float) -> list[str]:
    """READY caches idle past their TTL, unpinned and not being read."""
    names = []
    for r in records:
        value = book.get(r.name)
        if (
            r.state == "READY"
            and not value.pinned
            and not book.readers(r.name)
            and value.expired(r.commit_time, now)
        ):
            names.append(r.name)
    return names


def retained_summary(records: Iterable[CacheRecord], book: RetentionBook) -> str:
    """Why the caches left cannot be evicted, for a refusal's message."""
    pinned = reading = writing = 0
    for r in records:
        if r.state != "READY":
            writing += 1
        elif book.get(r.name).pinned:
            pinned += 1
        elif book.readers(r.name):
            reading += 1
    return f"{pinned} pinned, {reading} being read, {writing} being written"
