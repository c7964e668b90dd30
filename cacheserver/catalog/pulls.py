"""One cache being pulled from the object store: each shard fetched once, readers waiting on it.

The store tier (cacheserver/catalog/remote.py) starts a pull when the catalog
adopts a cache only the store holds, and fetches its shards in the background or
only as they are read. A reader that needs a shard not yet here fetches it itself
if nobody has started it, else waits for it: each shard is fetched once (one GET)
however many readers ask. Each object is checked against the manifest's size and
SHA-256 before it is put in place (Bucket.download); a corrupt one is DATA_LOSS,
never served and never fetched again.
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
from cacheserver.logs import shown
from cacheserver.tier.bucket import Bucket
from client.wire.status import CacheServerError, DataLoss, StoreUnavailable

log = logging.getLogger(__name__)


class Pull:
    """One cache being pulled: each shard 'queued', 'running' or 'done'."""

    def __init__(
        self,
        stored: StoredCache,
        directory: Path,
        bucket: Bucket,
        capacity: Capacity,
        finished: Callable[[Pull], None],
    ) -> None:
        self.stored, self.directory = stored, directory
        self._bucket = bucket
        self._capacity = capacity
        self._finished = finished  # the tier's: called once every shard is here
        self.state = ["queued"] * len(stored.objects)
        self.errors: list[CacheServerError | None] = [None] * len(stored.objects)
        self.done_bytes = 0
        self.cancelled = False
        self.started = time.monotonic()
        self.cond = threading.Condition()

    def in_background(self, index: int) -> None:
        """Fetch shard index unless it is here or under way; errors are logged only."""
        with contextlib.suppress(CacheServerError):  # logged; a reader asking tries again
            self.fetch(index, wait=False)

    def fetch(self, index: int, wait: bool) -> None:
        """Fetch shard index unless it is here; wait: a reader, who waits for a fetch under
        way and gets its error; else the background, which leaves a shard others fetch."""
        with self.cond:
            while True:
                if self.cancelled:
                    if not wait:
                        return
                    raise StoreUnavailable(
                        f"the pull of cache {self.stored.record.name!r} "
                        "stopped (deleted, or the daemon is stopping)"
                    )
                state, error = self.state[index], self.errors[index]
                if state == "done" or (
                    not wait and (state == "running" or isinstance(error, DataLoss))
                ):
                    return
                if isinstance(error, DataLoss):
                    raise error  # a corrupt object stays refused; nothing is fetched again
                if state == "queued":
                    self.state[index] = "running"
                    break
                self.cond.wait()
        try:
            self._download(index)
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
                self.state[index], self.errors[index] = "queued", exc
                self.cond.notify_all()
            raise
        with self.cond:
            self.state[index], self.errors[index] = "done", None
            self.cond.notify_all()
            finished = all(s == "done" for s in self.state)
        if finished:
            self._finished(self)

    def _download(self, index: int) -> None:
        obj, info = self.stored.objects[index], self.stored.record.shards[index]
        self._capacity.reserve(self.stored.record.name, obj.size)
        shard_dir = self.directory / f"shard-{index:05d}"
        shard_dir.mkdir(exist_ok=True)

        def progress(n: int) -> None:
            metrics.STORE_PULLED_BYTES.inc(n)
            with self.cond:
                self.done_bytes += n

        self._bucket.download(obj, shard_dir / "data.mdb", progress)
        write_atomic(
            self.directory / f"shard-{index:05d}.json", json.dumps(asdict(info)), durable=False
        )
