"""A fleet read's ReadShard calls: queued per member in epoch order, drained on threads.

A fleet read (client/read/fetching/fleet.py, FleetFetcher) asks each shard of its requests of
the shard's owner. Its request threads each read their runs in order, so a call sent
ahead waits for its reader; and the requests in flight together ask a member for more
shards than it has streams (STREAMS_PER_MEMBER, client/_fleet.py). Two things decide
how fast the epoch goes:

- Which call a member serves first. Calls are queued per member (MemberQueue) and sent
  lowest epoch position first, whichever thread asked: the request the reader waits
  for completes first, and the window of requests moves on without a member going
  idle for want of asked shards.
- When a stream slot is free again. A call is drained on a thread of its own
  (FleetCall), DRAIN_CHUNKS chunks ahead of its reader, and gives its slot back once
  the member has sent the last chunk, not when its reader gets to it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from client.read.fetching.fetch import Closed

#: Chunks a call buffers ahead of its reader.
DRAIN_CHUNKS = 2
#: Seconds a reader waiting for a call not yet sent waits before looking for a free slot
#: itself (slots that other reads of this process give back do not wake it).
_SLOT_POLL = 0.05
_END = object()


class FleetCall:
    """One ReadShard call, queued, then sent and drained; iterate for its chunks.

    Iterating yields the chunks and raises the call's error if it failed; it waits
    while the call is queued. cancel() ends it early, queued or sent.
    """

    def __init__(self, send: Callable[[], Any], queue: MemberQueue) -> None:
        self._send = send
        self._queue = queue
        self._cond = threading.Condition()
        self._chunks: collections.deque[Any] = collections.deque()
        self._call: Any = None
        self._cancelled = False
        self.finished = False  # the member sent everything, or the call failed

    def start(self, permits: threading.BoundedSemaphore) -> bool:
        """Send the call holding one of permits; False if nothing was sent (cancelled, or
        sending failed: the reader gets the error), and the permit is the caller's again."""
        with self._cond:
            if self._cancelled:
                return False
            try:
                self._call = self._send()
            except Exception as err:  # e.g. the client was closed meanwhile
                self._chunks.append(err)
                self.finished = True
                self._cond.notify_all()
                return False
        threading.Thread(
            target=self._drain, args=(permits,), daemon=True, name="shardcache-fleet-call"
        ).start()
        return True

    def _drain(self, permits: threading.BoundedSemaphore) -> None:
        end: Any = _END
        try:
            for chunk in self._call:
                with self._cond:
                    while len(self._chunks) >= DRAIN_CHUNKS and not self._cancelled:
                        self._cond.wait()
                    self._chunks.append(chunk)
                    self._cond.notify_all()
        except Exception as err:  # the call's RpcError, raised to the reader
            end = err
        finally:
            permits.release()
            with self._cond:
                self._chunks.append(end)
                self.finished = True
                self._cond.notify_all()
            self._queue.dispatch()  # the member's next call, in the slot this one had

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            call = self._call
            if call is None:
                self._chunks.append(Closed())  # queued: never sent, the member skips it
                self.finished = True
            self._cond.notify_all()
        if call is not None:
            call.cancel()

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._cond:
                while not self._chunks:
                    if not self._cond.wait(_SLOT_POLL) and self._call is None:
                        self._cond.release()
                        try:
                            self._queue.dispatch()  # a slot another read gave back
                        finally:
                            self._cond.acquire()
                item = self._chunks.popleft()
                self._cond.notify_all()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class MemberQueue:
    """One member's calls of one read, sent lowest position first, each holding one of
    the member's permits (shared by every read of the process) until it is drained."""

    def __init__(self, permits: threading.BoundedSemaphore) -> None:
        self._permits = permits
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, FleetCall]] = []
        self._order = itertools.count()  # ties: first asked, first sent

    def submit(self, position: int, send: Callable[[], Any]) -> FleetCall:
        """Queue a call (send() makes it when a slot is free); it may go out at once."""
        call = FleetCall(send, self)
        with self._lock:
            heapq.heappush(self._heap, (position, next(self._order), call))
        self.dispatch()
        return call

    def dispatch(self) -> None:
        """Send queued calls, lowest position first, while the member has free slots."""
        while True:
            with self._lock:
                if not self._heap or not self._permits.acquire(blocking=False):
                    return
                _, _, call = heapq.heappop(self._heap)
            if not call.start(self._permits):
                self._permits.release()
