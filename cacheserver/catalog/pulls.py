"""One cache being pulled from the object store: each shard fetched once, readers waiting on it.

The store tier (cacheserver/catalog/remote.py) starts a pull when the catalog
adopts a cache only the store holds, and fetches its shards in the background or
only as they are read. A reader that needs a shard not yet here fetches it itself
if nobody has started it, else waits for it: each shard is fetched once (one GET)
however many readers ask. Each object is checked against the manifest's size and
SHA-256 before it is put in place (Bucket.download); a corrupt one is DATA_LOSS,
never served and never fetched again.

**Partial residency.** A shard is admitted (made resident) only when the capacity has
room for it; a cache larger than that room (cacheserver/catalog/capacity.py) keeps the
shards admitted while there was room, and every other shard is *streamed*: read through
the cache's :class:`~cacheserver.catalog.window.StreamWindow`, fetched for the pass and
freed as it moves on. A shard is admitted only if room stays free beside it for the
shards not here yet, or for the window that would stream them (``StreamWindow.room``),
whichever is less: a cache that fits is pulled whole, one that does not keeps its
window's room. An admitted shard stays until the whole cache goes (evicted,
deleted): reads of the cache never replace it, so each pass hits the same resident
subset whatever its order, where least-recently-used would evict each shard just before
the next pass needs it. A streamed shard is admitted later when room has come back (a
read of it tries again). A pinned cache admits every shard or fails as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from cacheserver import metrics
from cacheserver.catalog.capacity import Capacity
from cacheserver.catalog.manifest import write_atomic
from cacheserver.catalog.stored import StoredCache
from cacheserver.catalog.window import WINDOW_SLOTS, StreamWindow
from cacheserver.logs import shown
from cacheserver.tier.bucket import Bucket
from client.wire.status import CacheServerError, CapacityExceeded, DataLoss, StoreUnavailable

log = logging.getLogger(__name__)


class Pull:
    """One cache being pulled: each shard 'queued', 'running', 'done' (resident) or
    'streamed' (no room: read through the window)."""

    def __init__(
        self,
        stored: StoredCache,
        directory: Path,
        bucket: Bucket,
        capacity: Capacity,
        finished: Callable[[Pull], None],
        pinned: Callable[[], bool] = lambda: False,
        forget: Callable[[Path], None] = lambda path: None,
    ) -> None:
        self.stored, self.directory = stored, directory
        self._bucket = bucket
        self._capacity = capacity
        self._finished = finished  # the tier's: called once every shard is here
        self._pinned = pinned  # whether the cache is pinned now (then: resident or refused)
        self.state = ["queued"] * len(stored.objects)
        self.errors: list[CacheServerError | None] = [None] * len(stored.objects)
        self.done_bytes = 0
        self.cancelled = False
        self.started = time.monotonic()
        self.cond = threading.Condition()
        name = stored.record.name
        largest = max((o.size for o in stored.objects), default=1) or 1
        slots = (
            min(WINDOW_SLOTS, max(1, capacity.max_bytes // largest))
            if capacity.max_bytes
            else WINDOW_SLOTS
        )
        self.window = StreamWindow(name, directory, stored.objects, bucket, capacity, forget, slots)
        #: The room the window may take (its largest shards'), fixed with the cache.
        self._window_room = StreamWindow.room(stored.objects, slots)
        self.size = stored.size  # bytes in the store, all shards
        #: A shard was refused room: admission keeps the window's room free from then on.
        self.partial = False
        #: shard reads served from resident shards (the hit ratio's numerator)
        self.resident_reads = 0
        # kept as shards change state (under cond), so that admitting one, and the status,
        # cost the same whatever the cache's shard count: shards and bytes resident, shards
        # being fetched
        self._done_shards = self._done_bytes = self._running = 0

    def resident(self) -> tuple[int, int]:
        """(resident shards, their bytes in the store)."""
        with self.cond:
            return self._done_shards, self._done_bytes

    def settled(self) -> bool:
        """A partially resident cache with no shard being fetched: at rest, so eviction
        may drop it whole (the store holds it)."""
        with self.cond:
            return self.partial and not self._running

    def resident_now(self, index: int) -> bool:
        with self.cond:
            return self.state[index] == "done"

    def next_streamed(self, shards: list[int], count: int = 1) -> list[int]:
        """The first count of shards that are streamed."""
        with self.cond:
            return [i for i in shards if self.state[i] == "streamed"][:count]

    def close(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()
        self.window.close()

    def in_background(self, index: int) -> None:
        """Fetch shard index unless it is here or under way; errors are logged only."""
        with contextlib.suppress(CacheServerError):  # logged; a reader asking tries again
            self.fetch(index, wait=False)

    def fetch(self, index: int, wait: bool) -> bool:
        """Fetch shard index unless it is here; wait: a reader, who waits for a fetch under
        way and gets its error; else the background, which leaves a shard others fetch.
        True: the shard is resident; False: streamed (or left to others, wait=False)."""
        with self.cond:
            while True:
                if self.cancelled:
                    if not wait:
                        return False
                    raise StoreUnavailable(
                        f"the pull of cache {self.stored.record.name!r} "
                        "stopped (deleted, or the daemon is stopping)"
                    )
                state, error = self.state[index], self.errors[index]
                if state == "done":
                    if wait:
                        self.resident_reads += 1
                    return True
                if not wait and (state != "queued" or isinstance(error, DataLoss)):
                    return False
                if isinstance(error, DataLoss):
                    raise error  # a corrupt object stays refused; nothing is fetched again
                if state in ("queued", "streamed"):  # streamed: room may have come back
                    was, self.state[index] = state, "running"
                    self._running += 1
                    break
                self.cond.wait()
        try:
            admitted = self._download(index)
        except CacheServerError as exc:
            metrics.STORE_ERRORS.labels("pull").inc()
            log.warning(
                "cache %r: pulling shard %d from %s failed: %s",
                self.stored.record.name,
                index,
                self._bucket,
                shown(str(exc), 500),
            )
            with self.cond:
                self.state[index], self.errors[index] = was, exc
                self._running -= 1
                self.cond.notify_all()
            raise
        with self.cond:
            self.state[index] = "done" if admitted else "streamed"
            self.errors[index] = None
            self._running -= 1
            if admitted:
                self._done_shards += 1
                self._done_bytes += self.stored.objects[index].size
                if wait:
                    self.resident_reads += 1
            self.cond.notify_all()
            finished = self._done_shards == len(self.state)
        if finished:
            self._finished(self)
        return admitted

    def _admit(self, index: int) -> bool:
        """Reserve room for shard index; False: no room (it is streamed), unless pinned."""
        obj, name = self.stored.objects[index], self.stored.record.name
        with self.cond:  # the shards not here yet besides this one (which is not): room
            # for them, or for the window that would stream them, must stay free
            rest = self.size - self._done_bytes - obj.size
        # the window's slots in use are counted already (they are this cache's bytes)
        headroom = max(0, min(rest, self._window_room) - self.window.reserved())
        try:
            self._capacity.reserve(name, obj.size, headroom=headroom)
            return True
        except CapacityExceeded as exc:
            if self._pinned():
                raise CapacityExceeded(
                    f"cache {name!r} is pinned but does not fit: {exc}; unpin it to read it "
                    "partially resident (the shards that do not fit streamed from the store)"
                ) from None
        if not self.partial:
            with self.cond:
                self.partial = True
            log.info(
                "cache %r (%d bytes) does not fit in this daemon's room: shard %d and "
                "the others without room are streamed from %s for each pass",
                name,
                self.stored.size,
                index,
                self._bucket,
            )
        return False

    def _download(self, index: int) -> bool:
        obj, info = self.stored.objects[index], self.stored.record.shards[index]
        if not self._admit(index):
            return False
        shard_dir = self.directory / f"shard-{index:05d}"
        shard_dir.mkdir(exist_ok=True)

        def progress(n: int) -> None:
            metrics.STORE_PULLED_BYTES.inc(n)
            with self.cond:
                self.done_bytes += n

        try:
            self._bucket.download(obj, shard_dir / "data.mdb", progress)
        except BaseException:
            self._capacity.unreserve(self.stored.record.name, obj.size)
            raise
        write_atomic(
            self.directory / f"shard-{index:05d}.json", json.dumps(asdict(info)), durable=False
        )
        return True
