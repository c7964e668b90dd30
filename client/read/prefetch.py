"""A queue bounded in bytes between one producer thread and one consumer.

It carries items and errors alike; :meth:`ByteBudgetQueue.close` wakes a
blocked producer so that stopping early never leaves a thread behind (the
pattern of google/grain's prefetch).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Closed(Exception):
    """Raised in the producer when the consumer has closed the queue."""


class _End:
    pass


_END = _End()


class ByteBudgetQueue(Generic[T]):
    """put() blocks while the queued items exceed capacity bytes.

    One item is always admitted into an empty queue, however large, so an
    element bigger than the budget still flows.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"prefetch budget must be at least 1 byte, got {capacity}")
        self.capacity = capacity
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._closed = False

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put(self, item: T, nbytes: int) -> None:
        with self._cond:
            while (not self._closed and self._items
                   and self._bytes + nbytes > self.capacity):
                self._cond.wait()
            if self._closed:
                raise Closed()
            self._items.append((item, nbytes))
            self._bytes += nbytes
            self._cond.notify_all()

    def _put_raw(self, item: Any) -> None:
        with self._cond:
            if self._closed:
                raise Closed()
            self._items.append((item, 0))
            self._cond.notify_all()

    def put_error(self, exc: BaseException) -> None:
        self._put_raw(exc)

    def put_end(self) -> None:
        self._put_raw(_END)

    def get(self) -> T | BaseException | _End:
        with self._cond:
            while not self._items:
                self._cond.wait()
            item, nbytes = self._items.popleft()
            self._bytes -= nbytes
            self._cond.notify_all()
            return item  # type: ignore[no-any-return]

    def close(self) -> list[T]:
        """Wake everyone; return what was still queued (for the caller to release)."""
        with self._cond:
            self._closed = True
            left = [item for item, _ in self._items
                    if item is not _END and not isinstance(item, BaseException)]
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            return left


class Prefetcher(Generic[T]):
    """Runs produce(put) in a thread; iterate to consume; close() to stop early.

    produce calls put(item, nbytes) for each item and returns when done; an
    exception it raises reaches the consumer at that point in the stream.
    """

    def __init__(self, produce: Callable[[Callable[[T, int], None]], None], capacity: int,
                 name: str = "shardcache-prefetch", on_close: Callable[[], None] | None = None
                 ) -> None:
        self._queue: ByteBudgetQueue[T] = ByteBudgetQueue(capacity)
        self._on_close = on_close
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self, produce: Callable[[Callable[[T, int], None]], None]) -> None:
        try:
            produce(self._queue.put)
            self._queue.put_end()
        except Closed:
            pass
        except BaseException as exc:
            with contextlib.suppress(Closed):
                self._queue.put_error(exc)

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]

    def close(self, timeout: float = 30.0) -> list[T]:
        """Stop the producer and join it; returns items never consumed."""
        left = self._queue.close()
        if self._on_close is not None:
            self._on_close()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"prefetch thread {self._thread.name} did not stop within "
                               f"{timeout:g}s")
        return left
