"""The stream window of a partially resident cache: non-resident shards, fetched for a pass.

A cache pulled from the object store that does not fit in the daemon's room keeps a
stable subset of its shards resident (cacheserver/catalog/pulls.py); a read of any other
shard goes through this window. The window holds at most ``slots`` such shards, each
fetched from the store once (one GET, checked like a pull) into
``<cache dir>/stream/shard-NNNNN.<n>/`` and counted in the daemon's capacity as the
cache's bytes while it stays. A slot in use by a read is kept; when a read needs a shard
the window lacks and every slot is taken, an idle slot is dropped (its files deleted, its
bytes given back): one read to its end first, then one fetched ahead and not read yet,
then one a read began, each the least recently used; else the read waits for one to go
idle. So the window's room is bounded (``slots`` shards) and freed as the pass moves on.

:meth:`StreamWindow.prefetch` fetches a shard before a read asks for it, into a free slot
or one read to its end, without waiting: the reads of a run of stored order ask for the
next non-resident shard ahead of the reader. It never drops a shard a pass is still
reading between its requests (readers of several shards at once, each asking chunk by
chunk, would have it fetched twice). Knows nothing of gRPC.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cacheserver import metrics
from cacheserver.catalog.capacity import Capacity
from cacheserver.tier.bucket import Bucket, StoredObject
from client.wire.status import CacheServerError, StoreUnavailable

log = logging.getLogger(__name__)

#: Streamed shards a partially resident cache may hold at once: one per reader in
#: flight and one fetched ahead, for the usual two to three readers.
WINDOW_SLOTS = 4


@dataclass
class _Slot:
    shard: int
    path: Path
    ready: bool = False
    users: int = 0
    last: float = 0.0
    begun: bool = False  # a read took it (not only fetched ahead)
    done: bool = False  # a read went to its last element: the first to drop
    size: int = 0  # bytes reserved in the capacity for it


@dataclass
class Held:
    """The files of a shard held for a read: path, its directory; resident: the shard's own
    place in the cache (nothing held); read_to_end: set by the reader once it read the shard
    to its last element, so that the window drops it first once the hold ends."""

    path: Path
    resident: bool = False
    read_to_end: bool = False


class StreamWindow:
    """At most ``slots`` non-resident shards of one cache, fetched as reads need them."""

    def __init__(
        self,
        name: str,
        directory: Path,
        objects: list[StoredObject],
        bucket: Bucket,
        capacity: Capacity,
        forget: Callable[[Path], None],
        slots: int = WINDOW_SLOTS,
    ) -> None:
        self.name = name
        self._dir = directory / "stream"
        self._objects = objects
        self._bucket = bucket
        self._capacity = capacity
        self._forget = forget  # closes the daemon's idle maps of a slot's files
        self.slots = slots
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._serial = itertools.count()
        self._closed = False
        #: store bytes fetched into the window, shards fetched, shard reads it served, of
        #: them those same-host readers read from its files themselves (holding(direct=True))
        self.streamed_bytes = 0
        self.fetches = 0
        self.reads = 0
        self.direct_reads = 0

    @staticmethod
    def room(objects: list[StoredObject], slots: int = WINDOW_SLOTS) -> int:
        """The bytes a window of slots of these objects may take: the largest ones'."""
        return sum(sorted((o.size for o in objects), reverse=True)[:slots])

    def reserved(self) -> int:
        """The bytes the window's slots hold in the capacity now."""
        with self._cond:
            return sum(s.size for s in self._slots.values())

    def usage(self) -> tuple[int, int, int]:
        """(shards held, the bytes they hold in the capacity, reads using them now)."""
        with self._cond:
            slots = list(self._slots.values())
        return len(slots), sum(s.size for s in slots), sum(s.users for s in slots)

    @contextlib.contextmanager
    def hold(self, shard: int, to_end: bool = False) -> Iterator[Path]:
        """The directory of shard's files, fetched if need be, kept while the block lasts;
        to_end: the block reads the shard to its last element (once it has, without an
        error, the slot is the first to drop)."""
        with self.holding(shard) as held:
            yield held.path
            held.read_to_end = to_end

    @contextlib.contextmanager
    def holding(self, shard: int, direct: bool = False) -> Iterator[Held]:
        """shard's files, fetched if need be, kept while the block lasts: as hold, with the
        reader saying at the end whether it read to the end (Held.read_to_end). direct: a
        same-host reader reads the files itself, its hold spanning its RPCs
        (cacheserver/catalog/leases.py)."""
        slot = self._take(shard, wait=True)
        assert slot is not None
        if direct:
            with self._cond:
                self.direct_reads += 1
        held = Held(slot.path)
        try:
            yield held
        finally:
            with self._cond:
                slot.users -= 1
                slot.last = time.monotonic()
                slot.begun = True  # read under the lock only, once the slot is idle
                slot.done = slot.done or held.read_to_end
                self._cond.notify_all()

    def prefetch(self, shard: int) -> None:
        """Fetch shard into a free slot or one read to its end unless it is here; never
        waits; errors are logged only (the read that needs it fetches it again)."""
        try:
            slot = self._take(shard, wait=False)
        except CacheServerError as exc:
            log.info("cache %r: fetching shard %d ahead failed: %s", self.name, shard, exc)
            return
        if slot is not None:
            with self._cond:
                slot.users -= 1
                slot.last = time.monotonic()
                self._cond.notify_all()

    def close(self) -> None:
        """The cache is gone (evicted, deleted, whole): reads waiting fail, slots dropped."""
        with self._cond:
            self._closed = True
            slots, self._slots = list(self._slots.values()), {}
            self._cond.notify_all()
        for slot in slots:
            self._drop(slot)

    def _take(self, shard: int, wait: bool) -> _Slot | None:
        """shard's slot with one more user, fetched; None (wait=False): no slot free."""
        with self._cond:
            while True:
                if self._closed:
                    raise StoreUnavailable(
                        f"cache {self.name!r} was evicted or deleted while it was being read"
                    )
                slot = self._slots.get(shard)
                if slot is not None:
                    if slot.ready:
                        slot.users += 1
                        self.reads += int(wait)
                        return slot
                    if not wait:
                        return None  # being fetched: the read will find it
                    self._cond.wait()
                    continue
                victim = None
                if len(self._slots) >= self.slots:
                    idle = [s for s in self._slots.values() if s.ready and not s.users]
                    if not idle or not (wait or any(s.done for s in idle)):
                        if not wait:
                            return None
                        self._cond.wait()
                        continue
                    # a shard read to its end, else one fetched ahead, else one begun
                    victim = min(idle, key=lambda s: (not s.done, s.begun, s.last))
                    del self._slots[victim.shard]
                path = self._dir / f"shard-{shard:05d}.{next(self._serial)}"
                slot = self._slots[shard] = _Slot(shard, path, users=1)
                self.reads += int(wait)
                break
        if victim is not None:
            self._drop(victim)
        try:
            self._fetch(slot)
        except BaseException:
            with self._cond:
                if self._slots.get(shard) is slot:
                    del self._slots[shard]
                self._cond.notify_all()
            self._drop(slot)
            raise
        with self._cond:
            slot.ready, slot.last = True, time.monotonic()
            self._cond.notify_all()
            closed = self._closed
        if closed:
            self._drop(slot)
            raise StoreUnavailable(
                f"cache {self.name!r} was evicted or deleted while it was being read"
            )
        return slot

    def _fetch(self, slot: _Slot) -> None:
        obj = self._objects[slot.shard]
        self._capacity.reserve(self.name, obj.size)
        slot.size = obj.size
        slot.path.mkdir(parents=True, exist_ok=True)

        def progress(n: int) -> None:
            metrics.STORE_PULLED_BYTES.inc(n)
            with self._cond:
                self.streamed_bytes += n

        try:
            # scratch: a restart discards the window (no fsync, cacheserver/tier/bucket.py)
            self._bucket.download(obj, slot.path / "data.mdb", progress, durable=False)
        except CacheServerError:
            metrics.STORE_ERRORS.labels("pull").inc()
            raise
        with self._cond:
            self.fetches += 1

    def _drop(self, slot: _Slot) -> None:
        self._forget(slot.path)
        shutil.rmtree(slot.path, ignore_errors=True)
        if slot.size:
            self._capacity.unreserve(self.name, slot.size)
            slot.size = 0
