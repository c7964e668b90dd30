"""CacheSource: a READY cache as a random-access data source of NumPy elements (cc.source()).

Grain's ``RandomAccessDataSource`` protocol and PyTorch's map-style ``Dataset``
ask the same of a source: ``len()``, ``source[i]`` for the element at index i of
the stored order, and a batched fetch of a list of indices (``__getitems__``,
PyTorch's name; ``_getitems``, Grain's), thread-safe, picklable so that worker
processes reopen it. A batched fetch is one request for all its indices (the
records' ReadElements call, the data plane's, a fleet's owners', or reads of the
leased shard files: client/read/assembly/chunks.py's CacheReads), decoded chunk-wide and
cut into elements of the stored structure (client/numpy/batches.py).

The source connects lazily, in the process that first reads: pickling keeps the
cache's name, the read options and ``opener`` (which makes the client's daemons
anew), never a channel or a lease, which do not survive a fork. Worker processes
are to be spawned (Grain's are; PyTorch: ``multiprocessing_context="spawn"`` or
"forkserver"): gRPC aborts a forked child that opens a channel while a thread of
the parent was in a gRPC call at the fork (``ev_epoll1_linux.cc: Check failed``),
which a reading parent's lease renewal or prefetch can be at any time. A forked
copy of an open source still opens its own channels rather than use the parent's. Random access
to a cache of small elements stored in blocks decodes a whole block (~256 KiB)
per element; write such caches with ``block_bytes=0`` for random access.
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from client._daemons import Daemons
from client.numpy.batches import Columns, format_of
from client.read.opening import open_read
from client.read.planning import plan

#: Makes the daemons of a client like the one the source came from, and its local data dir.
Opener = Callable[[], tuple[Daemons, Path | None]]


class _Open:
    """What a process reads the source with: the daemons, the cache, its records."""

    def __init__(self, opener: Opener, name: str, options: plan.ReadOptions) -> None:
        self.pid = os.getpid()
        self.catalog, local_data_dir = opener()
        read = open_read(self.catalog, local_data_dir, name, options, "make the source again")
        self.cache = read.cache
        self.columns = Columns(format_of(name, read.cache.element_spec, read.layout))
        self.reads = read.records()

    def close(self) -> None:
        self.reads.close()
        self.catalog.close()


class CacheSource:
    """A READY cache's elements by index (its stored order), for Grain and PyTorch."""

    def __init__(
        self, name: str, opener: Opener, options: plan.ReadOptions, num_elements: int
    ) -> None:
        self.name = name
        self._opener = opener
        self._options = options  # direct and reconnect_timeout: how each process reads
        self._len = num_elements
        self._lock = threading.Lock()
        self._open: _Open | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "opener": self._opener,
            "options": self._options,
            "len": self._len,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["opener"], state["options"], state["len"])  # type: ignore[misc]

    def _opened(self) -> _Open:
        opened = self._open
        if opened is not None and opened.pid == os.getpid():  # no lock per read
            return opened
        with self._lock:
            if self._open is not None and self._open.pid != os.getpid():
                self._open = None  # a forked copy: the parent's channels and lease stay its own
            if self._open is None:
                self._open = _Open(self._opener, self.name, self._options)
            return self._open

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The elements at indices, in their order: one request for all of them."""
        n = self._len
        # Python ints, not NumPy reductions: a sampler's single index costs ~1 us so
        keys = [i + n if i < 0 else i for i in map(operator.index, indices)]
        if not keys:
            return []
        if min(keys) < 0 or max(keys) >= n:
            bad = next(i for i in map(operator.index, indices) if not -n <= i < n)
            raise IndexError(f"index {bad} is out of range for cache {self.name!r} of {n} elements")
        opened = self._opened()
        return list(opened.columns.elements([opened.reads(np.array(keys, np.int64))]))

    #: Grain's name for a batched fetch (SupportsBatchedReadRandomAccessDataSource).
    _getitems = __getitems__

    def close(self) -> None:
        """End this process's lease and channels; the source reopens on its next read."""
        with self._lock:
            opened, self._open = self._open, None
        if opened is not None:
            opened.close()

    def __enter__(self) -> CacheSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CacheSource({self.name!r}, {self._len} elements)"
