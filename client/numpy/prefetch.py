"""Chunk calls run ahead on a small thread pool, delivered in order, bounded.

An epoch's chunks (client/read/assembly/chunks.py's EpochChunks) are each a function of
their index: :class:`Prefetch` keeps up to ``ahead`` of them in flight on
``threads`` threads and hands them over in index order, as tf.data's
``range(count).map(chunk, deterministic=True)`` does for cc.dataset(). A
chunk's call releases the GIL for most of its time (I/O, CRC, zstd, the copy
into its arrays), so the threads overlap with the consumer. Memory: at most
``ahead`` decoded chunks (ArrayReader: as many as ``prefetch_bytes`` holds), plus
the one being consumed. An error of a chunk's call reaches the consumer when it
asks for that chunk; close() (also on an early stop) cancels the calls not yet
started, cancels those in flight (the chunks' close) and joins the threads.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: Threads running chunk calls: they spend most of their time waiting on I/O.
THREADS = 8
#: At most this many chunks in flight, whatever prefetch_bytes allows.
MAX_AHEAD = 16
#: Direct reads of elements smaller than this (stored bytes) run on one thread (threads()).
SMALL_ELEMENT_BYTES = 16 << 10


def threads(path: str, stored_bytes: int, elements: int) -> int:
    """Threads for the chunk calls of a read over path ("direct", "plane", ...): one for a
    direct read of small elements, THREADS otherwise.

    A direct read of small elements spends its time in Python per element or per chunk
    (LMDB lookups that let go of the GIL and take it back, decoding), not waiting on I/O:
    more threads only take the GIL from each other (1 KB elements: 1.4-1.5x the elements/s
    at half the CPU; docs/design.md, "Random reads")."""
    small = stored_bytes < SMALL_ELEMENT_BYTES * max(elements, 1)
    return 1 if path == "direct" and small else THREADS


class Prefetch:
    """The chunks of one epoch (an object with count, chunk(i) and close()), in order."""

    def __init__(self, chunks: Any, ahead: int, threads: int = THREADS) -> None:
        self._chunks = chunks
        self._ahead = max(1, ahead)
        self._pool = ThreadPoolExecutor(
            max(1, min(threads, self._ahead)), thread_name_prefix="shardcache-numpy-read"
        )
        self._queue: collections.deque[Future[tuple[int, list[Any]]]] = collections.deque()
        self._next = 0
        self._closed = False

    def _fill(self) -> None:
        while len(self._queue) < self._ahead and self._next < self._chunks.count:
            self._queue.append(self._pool.submit(self._chunks.chunk, self._next))
            self._next += 1

    def __iter__(self) -> Iterator[tuple[int, list[Any]]]:
        try:
            self._fill()
            while self._queue:
                batch = self._queue.popleft().result()
                self._fill()
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for future in self._queue:
            future.cancel()
        self._queue.clear()
        try:
            self._chunks.close()  # cancels the calls in flight
        finally:
            self._pool.shutdown(wait=True)
