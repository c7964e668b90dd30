"""Keeps a shard's pages in the page cache ahead of a reader walking it in key order.

LMDB reads through its memory map. Cold, a page fault makes the kernel read
only around the faulting page (a shard streamed at ~250 MB/s from a disk that
reads a plain file at ~1.5 GB/s, bench/ceilings.py), and the thread that
faults waits for the disk *holding the GIL*: py-lmdb hands out views into the
map, and the fault happens when Python copies them. Every other thread of the
process stands still meanwhile; in a direct reader (client/read/fetching/direct.py) those
are the decoders and TensorFlow's generator, so a cold direct epoch ran at
0.73x `cache(file)` on a 200 MB/s disk where the same read over gRPC, whose
stall is in another process, ran at 1.29x (docs/benchmarks.md).

:class:`ReadAhead` runs a thread of its own that pulls the window after the
reader into the page cache with ``sendfile()`` to /dev/null: the kernel reads
the pages without copying them anywhere, and the GIL is free while the disk
works. ``at()`` makes the reader wait, without the GIL, until the pages of its
next chunk are in. Records are appended in key order, so record i sits near
i/n of the file.

A step whose pages are all in the page cache already is not walked: Linux's
``cachestat(2)`` (6.5 and later) counts them in one call, and a warm shard's
pass then costs its read-ahead a few microseconds a step instead of a
``sendfile`` walk over every page (docs/design.md, "Read-ahead thread for cold
shards"). Where the call is missing or refused (an older kernel, a seccomp
profile that predates it) every step is walked, as before.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

#: How far ahead of the reader the thread keeps the page cache.
WINDOW_BYTES = 32 << 20
#: One sendfile() call: the reader may go on as soon as its part is in.
STEP_BYTES = 4 << 20
#: at() waits until this much after the reader's estimated position is in (a
#: chunk is ~1-4 MiB; the estimate is proportional, so keep a margin).
NEED_BYTES = 8 << 20

#: cachestat(2)'s number: one for every architecture (the unified table since Linux 5.1).
_CACHESTAT = 451


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (field, ctypes.c_uint64)
        for field in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


_syscall: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # no libc syscall() here: walk every step
    pass


def cached(fd: int, start: int, stop: int) -> bool:
    """Whether every page of fd's bytes [start, stop) is in the page cache; False where the
    kernel cannot say (then it stops asking for the whole process)."""
    global _syscall
    if _syscall is None or stop <= start:
        return False
    first, last = start // mmap.PAGESIZE, (stop - 1) // mmap.PAGESIZE
    span, stat = _Range(start, stop - start), _Stat()
    if _syscall(_CACHESTAT, fd, ctypes.byref(span), ctypes.byref(stat), 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
            _syscall = None  # not this kernel's (or this sandbox's): never again
        return False
    return bool(stat.nr_cache >= last - first + 1)


class ReadAhead:
    """Read-ahead for one reader of one shard's data.mdb; close() when done."""

    def __init__(
        self, path: Path, file_bytes: int, num_records: int, stop: int | None = None
    ) -> None:
        """For a reader of records [.., stop) of the shard at path (None: to the end)."""
        try:
            self._fd = os.open(path / "data.mdb", os.O_RDONLY)
        except FileNotFoundError:  # deleted under a reader that holds it (hold()): no help
            self._fd, file_bytes = -1, 0
        self._records = max(num_records, 1)
        if stop is not None and stop < num_records:  # nothing past the range (+ a page run)
            file_bytes = min(file_bytes, -(-stop * file_bytes // self._records) + STEP_BYTES)
        self._size = file_bytes
        self._cond = threading.Condition()
        self._loaded = 0  # bytes [0, _loaded) are in the page cache (or sendfile failed)
        self._want = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def at(self, index: int) -> None:
        """The reader is about to read from record index: wait until its pages are in."""
        if self._size == 0:
            return
        pos = index * self._size // self._records
        need = min(self._size, pos + NEED_BYTES)
        want = min(self._size, pos + WINDOW_BYTES)
        if self._loaded >= need and want <= self._want + STEP_BYTES and self._thread:
            # in, and the window less than a step short: no lock, no wake-up of the thread
            # (a random reader of single elements called here ~25 us per element for both)
            return
        with self._cond:
            if self._closed:  # its file is closed (or the thread's to close)
                return
            self._want = max(self._want, want)
            if self._thread is None:
                self._loaded = min(pos, self._size)  # a range read starts mid-file
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="shardcache-read-ahead"
                )
                self._thread.start()
            self._cond.notify_all()
            while self._loaded < need and not self._closed:
                self._cond.wait()

    def close(self) -> None:
        """Stop reading ahead. Returns at once: a thread in the middle of a step finishes it
        and closes the file (a request's answer does not wait for it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            started = self._thread is not None
        if not started and self._fd >= 0:
            os.close(self._fd)

    def _run(self) -> None:
        try:
            self._walk()
        finally:
            if self._fd >= 0:
                os.close(self._fd)

    def _walk(self) -> None:
        with open(os.devnull, "wb") as null:
            while True:
                with self._cond:
                    while self._loaded >= self._want and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    start = self._loaded
                    end = min(self._want, start + STEP_BYTES)
                try:
                    if cached(self._fd, start, end):  # in already: nothing to walk
                        start = end
                    while start < end:
                        sent = os.sendfile(null.fileno(), self._fd, start, end - start)
                        if sent == 0:  # shorter than LMDB said: the reader's checks report it
                            end = self._size
                            break
                        start += sent
                except OSError:  # no read-ahead then: the reader faults the pages in itself
                    end = self._size
                with self._cond:
                    self._loaded = end
                    self._cond.notify_all()


class ReadAheads:
    """The read-aheads of one reader's requests, one per shard file, each kept for the next
    request of the same file: a reader that asks for a shard a chunk at a time (the daemon's
    data plane, one request per chunk) walks each page once and starts one thread per shard,
    not one per request. For one thread's requests at a time; close() when the reader goes."""

    def __init__(self, limit: int = 4) -> None:
        self._limit = limit
        #: path -> (the open shard it walks, its read-ahead); the least recently used first
        self._by_path: OrderedDict[Path, tuple[Any, ReadAhead]] = OrderedDict()

    def get(self, path: Path, shard: Any, file_bytes: int, num_records: int) -> ReadAhead:
        """The read-ahead of the shard at path, opened as shard (a file replaced since the
        last request is opened anew, and its read-ahead with it)."""
        kept = self._by_path.pop(path, None)
        if kept is not None and kept[0] is shard:
            self._by_path[path] = kept
            return kept[1]
        if kept is not None:
            kept[1].close()
        ahead = ReadAhead(path, file_bytes, num_records)
        self._by_path[path] = (shard, ahead)
        while len(self._by_path) > self._limit:
            self._by_path.popitem(last=False)[1][1].close()
        return ahead

    def close(self) -> None:
        for _, ahead in self._by_path.values():
            ahead.close()
        self._by_path.clear()
