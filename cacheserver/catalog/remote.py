"""The object-store tier: committed caches are published to it, missing ones pulled from it.

``serve --store s3://BUCKET/PREFIX`` gives the catalog a :class:`StoreTier`.

**Publish.** Every committed cache (written, materialized, or found at startup
not yet stored) is queued. A publisher thread uploads its shards' files,
``UPLOAD_SHARDS`` at a time (each multipart above 64 MiB), under a fresh upload
id, then creates its manifest with If-None-Match: * (cacheserver/catalog/stored.py).
The manifest is the commit point: of two daemons publishing one name exactly one
manifest is made, and the loser deletes its objects; a half-uploaded cache has no
manifest, so no daemon ever sees it. Progress is kept in the cache's
``store.json`` (upload id, objects done), so a restarted daemon finishes the
upload instead of redoing it. A store that cannot be reached is retried with
exponential backoff (1 s to 60 s), logged and counted; the local cache serves
meanwhile.

**Pull.** A read or a WriteBegin naming a cache this daemon lacks looks for its
manifest in the store, one GET however many ask at once, the answer (found or not)
kept a few seconds (cacheserver/catalog/lookups.py). Found, the cache is registered
READY at once and its shards are fetched in the background, ``PULL_SHARDS`` at a
time; a reader that needs a shard not yet here fetches it or waits for it, each
shard fetched once and checked (cacheserver/catalog/pulls.py). Until every shard is
here the cache directory holds ``pulling.json`` instead of a manifest, so a daemon
killed mid-pull discards it at startup and pulls again on the next miss.
With ``--store-pull on-read`` (a fleet member, docs/fleet.md) nothing is fetched
in the background: only the shards read from this daemon, which are the ones
it owns.

**Eviction** may drop a local copy only once the store holds it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from cacheserver import metrics
from cacheserver.catalog import stored as layout
from cacheserver.catalog.capacity import Capacity
from cacheserver.catalog.lookups import Lookups
from cacheserver.catalog.manifest import CacheRecord, du, write_atomic
from cacheserver.catalog.pulls import Pull
from cacheserver.catalog.stored import StoredCache
from cacheserver.catalog.window import Held
from cacheserver.logs import shown
from cacheserver.tier.bucket import Bucket, StoredObject
from cacheserver.tier.requests import Tally
from client.wire.status import CacheServerError, DataLoss, StoreUnavailable

log = logging.getLogger(__name__)

UPLOAD_SHARDS = 4
PULL_SHARDS = 4
#: Streamed shards fetched ahead of each read of a pass, in its order: into free window
#: slots or ones read to their end (cacheserver/catalog/window.py). Two, with the window's
#: four slots, had reads drop shards fetched ahead and fetch them again.
AHEAD = 1
STATE_FILE = "store.json"
PULLING_FILE = "pulling.json"
_FIRST_BACKOFF, _MAX_BACKOFF = 1.0, 60.0

# the states of StoreStatus (client/wire/v1: STORE_STATE_*)
LOCAL, PUBLISHING, STORED, PULLING, CONFLICT, REMOTE = (
    "LOCAL",
    "PUBLISHING",
    "STORED",
    "PULLING",
    "CONFLICT",
    "REMOTE",
)


@dataclass
class StoreStatus:
    """Where one cache stands in the store, for ls / info and the metrics."""

    state: str
    done_bytes: int = 0
    total_bytes: int = 0
    done_shards: int = 0
    detail: str = ""
    #: requests by kind, bytes in and out, this daemon's calls for the cache cost the store
    cost: Tally = field(default_factory=Tally)
    #: Residency (cacheserver/catalog/pulls.py): shards on local disk and their bytes,
    #: store bytes streamed through the window, shard reads served resident and streamed.
    resident_shards: int = 0
    resident_bytes: int = 0
    streamed_bytes: int = 0
    resident_reads: int = 0
    streamed_reads: int = 0
    #: The stream window now: shards held, their bytes, reads using them.
    window_shards: int = 0
    window_bytes: int = 0
    window_reads: int = 0
    #: Of streamed_reads, those same-host readers read from the window's files themselves.
    streamed_direct_reads: int = 0


@dataclass
class _Published:
    """A cache's store.json: its upload id, the objects uploaded so far, whether stored."""

    upload: str = field(default_factory=layout.new_upload)
    objects: dict[int, StoredObject] = field(default_factory=dict)
    stored: bool = False

    @classmethod
    def load(cls, path: Path) -> _Published:
        try:
            doc = json.loads(path.read_text())
            return cls(
                str(doc["upload"]),
                {int(i): StoredObject(**o) for i, o in doc["objects"].items()},
                bool(doc["stored"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls()

    def save(self, path: Path) -> None:
        write_atomic(
            path,
            json.dumps(
                {
                    "upload": self.upload,
                    "stored": self.stored,
                    "objects": {i: asdict(o) for i, o in self.objects.items()},
                }
            ),
        )


class StoreTier:
    """Publishes a catalog's committed caches to one bucket and pulls what it lacks."""

    def __init__(
        self,
        bucket: Bucket,
        caches_dir: Path,
        capacity: Capacity,
        ready: Callable[[str], CacheRecord | None],
        *,
        pull_all: bool = True,
        pinned: Callable[[str], bool] = lambda name: False,
        forget_maps: Callable[[Path], None] = lambda path: None,
    ) -> None:
        self.bucket = bucket
        self._pinned = pinned  # the catalog's: whether a cache is pinned now
        self._forget_maps = forget_maps  # closes the idle maps of files about to go
        self._pull_all = pull_all  # else on-read: only the shards asked for
        self._caches_dir = caches_dir
        self._capacity = capacity
        self._ready = ready  # the catalog's READY record of a name, or None
        self._lock = threading.Condition()
        self._status: dict[str, StoreStatus] = {}
        self._due: dict[str, float] = {}  # publish queue: name -> when to try
        self._attempts: dict[str, int] = {}
        self._pulls: dict[str, Pull] = {}
        #: per cache, the shard orders of the passes reading it (by lease id): a read of
        #: one of their shards fetches the next streamed one ahead (fetch_ahead)
        self._plans: dict[str, dict[str, tuple[list[int], dict[int, int]]]] = {}
        self._lookups = Lookups(self._fetch)
        self._stopped = False
        self._pullers = ThreadPoolExecutor(PULL_SHARDS, thread_name_prefix="shardcache-pull")
        self._uploads = ThreadPoolExecutor(UPLOAD_SHARDS, thread_name_prefix="shardcache-put")
        self._publisher = threading.Thread(
            target=self._publish_loop, daemon=True, name="shardcache-publish"
        )
        metrics.STORE_UNPUBLISHED.set_function(lambda: len(self._due))
        metrics.RESIDENCY.source = self.residency

    def start(self, records: list[CacheRecord]) -> None:
        """Queue the READY caches found at startup that the store does not hold yet."""
        for record in records:
            if _Published.load(self._dir(record.name) / STATE_FILE).stored:
                self._status[record.name] = StoreStatus(
                    STORED, record.disk_bytes, record.disk_bytes, len(record.shards)
                )
            else:
                self.publish(record)
        self._publisher.start()
        log.info(
            "object store %s%s: %d caches stored, %d to publish",
            self.bucket,
            f" at {self.bucket.endpoint}" if self.bucket.endpoint else "",
            len(records) - len(self._due),
            len(self._due),
        )

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
            for pull in self._pulls.values():
                pull.cancelled = True
        self._pullers.shutdown(wait=False, cancel_futures=True)

    def _dir(self, name: str) -> Path:
        return self._caches_dir / name

    # ------------------------------------------------------------------ status

    def status(self, name: str) -> StoreStatus:
        cost = self.bucket.requests.of(name)
        with self._lock:
            pull = self._pulls.get(name)
            status = self._status.get(name)
        if pull is not None:
            shards, nbytes = pull.resident()
            window = pull.window
            held, held_bytes, using = window.usage()
            return StoreStatus(
                PULLING,
                pull.done_bytes,
                pull.size,
                shards,
                f"partially resident: {shards} of {len(pull.state)} shards on local disk, "
                "the others streamed from the store for each pass"
                if pull.partial
                else "",
                cost=cost,
                resident_shards=shards,
                resident_bytes=nbytes,
                streamed_bytes=window.streamed_bytes,
                resident_reads=pull.resident_reads,
                streamed_reads=window.reads,
                window_shards=held,
                window_bytes=held_bytes,
                window_reads=using,
                streamed_direct_reads=window.direct_reads,
            )
        status = replace(status or StoreStatus(LOCAL), cost=cost)
        record = self._ready(name)
        if record is not None:  # whole on local disk
            status.resident_shards, status.resident_bytes = len(record.shards), record.disk_bytes
        return status

    def residency(self) -> dict[str, tuple[int, int, int, int, int, int]]:
        """Per partially resident cache: (resident shards, resident bytes, store bytes
        streamed, shard reads served resident, streamed, of those read by same-host readers
        from the window's files), for /metrics."""
        out = {}
        for name, pull in self.partial().items():
            shards, nbytes = pull.resident()
            w = pull.window
            out[name] = (
                shards,
                nbytes,
                w.streamed_bytes,
                pull.resident_reads,
                w.reads,
                w.direct_reads,
            )
        return out

    def partial(self) -> dict[str, Pull]:
        """The pulls of the caches that do not fit whole (partially resident), by name."""
        with self._lock:
            return {name: pull for name, pull in self._pulls.items() if pull.partial}

    def evictable(self, name: str) -> bool:
        """Whether the local copy of name may be dropped: the store holds it, whole."""
        with self._lock:
            pull = self._pulls.get(name)
            if pull is not None:  # a partially resident cache at rest: the store holds it
                return pull.settled()
            return getattr(self._status.get(name), "state", "") == STORED

    def forget(self, name: str) -> None:
        """The local copy is gone (deleted, evicted): stop publishing or pulling it."""
        with self._lock:
            self._status.pop(name, None)
            self._due.pop(name, None)
            self._attempts.pop(name, None)
            pull = self._pulls.pop(name, None)
        self._lookups.forget(name)
        if pull is not None:
            pull.close()
            self._capacity.release(name)

    # ------------------------------------------------------------------ publishing

    def publish(self, record: CacheRecord) -> None:
        """Queue a READY cache for publishing."""
        try:
            total = sum(
                self._shard_file(record.name, s.index).stat().st_size for s in record.shards
            )
        except OSError:  # deleted meanwhile: _publish finds it gone
            total = 0
        with self._lock:
            self._status[record.name] = StoreStatus(LOCAL, 0, total, 0, "queued")
            self._due[record.name] = time.monotonic()
            self._lock.notify_all()

    def _publish_loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopped:
                    now = time.monotonic()
                    ready = [n for n, t in self._due.items() if t <= now]
                    if ready:
                        break
                    wait = min(self._due.values(), default=now + 3600) - now
                    self._lock.wait(timeout=wait)
                if self._stopped:
                    return
                name = min(ready, key=self._due.__getitem__)
                del self._due[name]
            try:
                self._publish(name)
            except CacheServerError as exc:
                self._retry_later(name, exc)
            except Exception as exc:
                if self._ready(name) is None:
                    continue  # deleted or evicted while it was being uploaded
                log.exception("publishing cache %r failed", name)  # a bug: keep the loop alive
                self._retry_later(name, exc)

    def _retry_later(self, name: str, exc: BaseException) -> None:
        metrics.STORE_ERRORS.labels("publish").inc()
        with self._lock:
            if name not in self._status or self._stopped:
                return
            n = self._attempts[name] = self._attempts.get(name, 0) + 1
            delay = min(_MAX_BACKOFF, _FIRST_BACKOFF * 2 ** (n - 1))
            self._due[name] = time.monotonic() + delay
            status = self._status[name]
            status.state, status.detail = (
                LOCAL,
                f"attempt {n} failed: {shown(str(exc), 300)}; retrying in {delay:.0f} s",
            )
            self._lock.notify_all()
        log.warning(
            "publishing cache %r to %s failed (attempt %d): %s; retrying in %.0f s; the "
            "local copy serves meanwhile",
            name,
            self.bucket,
            n,
            shown(str(exc), 500),
            delay,
        )

    def _set(self, name: str, **fields: object) -> None:
        with self._lock:
            status = self._status.get(name)
            if status is not None:
                for key, value in fields.items():
                    setattr(status, key, value)

    def _publish(self, name: str) -> None:
        record = self._ready(name)
        if record is None:  # deleted or evicted meanwhile
            return
        directory = self._dir(name)
        state = _Published.load(directory / STATE_FILE)
        if state.stored:
            self._set(name, state=STORED)
            return
        if self._settled_by_other(name, record, state):
            return
        self._set(
            name,
            state=PUBLISHING,
            detail="",
            done_shards=len(state.objects),
            done_bytes=sum(o.size for o in state.objects.values()),
        )
        started = time.monotonic()
        todo = [s.index for s in record.shards if s.index not in state.objects]
        for index, obj in zip(
            todo, self._uploads.map(lambda i: self._upload_shard(name, state.upload, i), todo)
        ):
            state.objects[index] = obj
            state.save(directory / STATE_FILE)
            self._set(name, done_shards=len(state.objects))
        objects = [state.objects[s.index] for s in record.shards]
        if self.bucket.create(layout.manifest_key(name), StoredCache(record, objects).to_doc()):
            state.stored = True
            state.save(directory / STATE_FILE)
            self._lookups.forget(name)
            self._set(name, state=STORED, detail="")
            size = sum(o.size for o in objects)
            log.info(
                "published cache %r to %s: %d shards, %d bytes in %.1f s",
                name,
                self.bucket,
                len(objects),
                size,
                time.monotonic() - started,
            )
        elif not self._settled_by_other(name, record, state):
            raise StoreUnavailable(f"the manifest of {name!r} exists but cannot be read back")
        with self._lock:
            self._attempts.pop(name, None)

    def _shard_file(self, name: str, index: int) -> Path:
        return self._dir(name) / f"shard-{index:05d}" / "data.mdb"

    def _upload_shard(self, name: str, upload: str, index: int) -> StoredObject:

        def progress(n: int) -> None:
            metrics.STORE_PUBLISHED_BYTES.inc(n)
            with self._lock:
                status = self._status.get(name)
                if status is not None:
                    status.done_bytes += n

        return self.bucket.upload(
            self._shard_file(name, index), layout.object_key(name, upload, index), progress
        )

    def _settled_by_other(self, name: str, record: CacheRecord, state: _Published) -> bool:
        """Is a manifest of name in the store already? Settle this publish against it."""
        stored = self._fetch(name)  # not a kept answer: the store as it is now
        if stored is None:
            return False
        ours = [o.key for o in state.objects.values()]
        if stored.record.fingerprint != record.fingerprint:
            detail = (
                f"the store holds another cache named {name!r} (fingerprint "
                f"{stored.record.fingerprint}, this one {record.fingerprint}): not "
                f"published; remove it there (cacheserver rm --store {name}) to publish "
                "this one"
            )
            self._set(name, state=CONFLICT, detail=detail)
            log.error("cache %r: %s", name, detail)
        else:  # the same pipeline's cache, published by another daemon first
            state.stored, state.objects = True, {}
            state.save(self._dir(name) / STATE_FILE)
            self._set(name, state=STORED, detail="")
            log.info(
                "cache %r is in %s already (published elsewhere); not uploaded", name, self.bucket
            )
        if ours:
            self.bucket.delete(ours)
        return True

    # ------------------------------------------------------------------ finding, pulling

    def find(self, name: str) -> StoredCache | None:
        """The store's manifest of name, or None; DataLoss if it cannot be parsed. One GET
        for callers asking at once, its answer kept LOOKUP_TTL_S (lookups.py)."""
        return self._lookups.find(name)

    def _fetch(self, name: str) -> StoredCache | None:
        """GET the manifest of name: the StoredCache, or None; DataLoss if damaged."""
        doc = self.bucket.get_json(layout.manifest_key(name))
        if doc is None:
            return None
        try:
            return StoredCache.from_doc(name, doc)
        except ValueError as exc:
            raise DataLoss(
                f"the manifest of cache {name!r} in {self.bucket} is damaged ({exc});"
                f" remove it there (cacheserver rm --store {name}) and build the "
                "cache again"
            ) from None

    def list_stored(self) -> list[StoredCache]:
        """The caches the store holds (those with a manifest), by name."""
        out = []
        for name in sorted(self.bucket.names("")):
            try:
                stored = self._fetch(name)
            except DataLoss as exc:
                log.warning("%s", exc)
                continue
            if stored is not None:
                out.append(stored)
        return out

    def delete(self, name: str) -> bool:
        """Remove name from the store: the manifest first (no daemon finds it from then on),
        then every object under it. False if the store did not hold it."""
        existed = self.bucket.get_json(layout.manifest_key(name)) is not None
        self.bucket.delete([layout.manifest_key(name)])
        self._lookups.forget(name)
        self.bucket.delete([key for key, _ in self.bucket.keys(f"{name}/")])
        with self._lock:
            if getattr(self._status.get(name), "state", "") == STORED:
                self._status[name].state = LOCAL
                self._status[name].detail = "removed from the store"
        if existed:
            log.info("removed cache %r from %s", name, self.bucket)
        return existed

    def adopt(self, stored: StoredCache) -> CacheRecord:
        """Start pulling stored (the catalog holds its lock, and no cache of that name).

        Returns the record to register: READY, readable shard by shard as they arrive."""
        name = stored.record.name
        directory = self._dir(name)
        directory.mkdir()
        write_atomic(directory / PULLING_FILE, json.dumps(stored.to_doc()), durable=False)
        pull = Pull(
            stored,
            directory,
            self.bucket,
            self._capacity,
            self._finish,
            pinned=lambda: self._pinned(name),
            forget=self._forget_maps,
        )
        with self._lock:
            self._pulls[name] = pull
        if not self._pull_all:
            log.info(
                "cache %r: found in %s (%d shards, %d bytes); pulling its shards as they are read",
                name,
                self.bucket,
                len(stored.objects),
                stored.size,
            )
            return replace(stored.record, disk_bytes=0)
        log.info(
            "cache %r: found in %s (%d shards, %d bytes); pulling it",
            name,
            self.bucket,
            len(stored.objects),
            stored.size,
        )
        for index in range(len(stored.objects)):
            self._pullers.submit(pull.in_background, index)
        return replace(stored.record, disk_bytes=0)

    def ensure(self, name: str, shards: range | list[int]) -> list[int]:
        """Return once every shard in shards of name that has room is on local disk
        (fetching or waiting); returns the others, which are streamed (pulls.py)."""
        with self._lock:
            pull = self._pulls.get(name)
        if pull is None:
            return []
        return [index for index in shards if not pull.fetch(index, wait=True)]

    @contextlib.contextmanager
    def shard_files(
        self, name: str, shard: int, resident: Path, to_end: bool = False
    ) -> Iterator[Path]:
        """The directory to read shard of name from while the block lasts: resident (its
        place in the cache) once it is on local disk, else its stream window's copy (to_end:
        the block reads it to its end: StreamWindow.hold)."""
        with self.held_files(name, shard, resident) as held:
            yield held.path
            held.read_to_end = to_end

    @contextlib.contextmanager
    def held_files(
        self, name: str, shard: int, resident: Path, direct: bool = False
    ) -> Iterator[Held]:
        """As shard_files, the reader saying at the block's end whether it read the shard to
        its end (Held.read_to_end); Held.resident: the shard's own place, nothing held.
        direct: a same-host reader reads the files itself (counted apart)."""
        with self._lock:
            pull = self._pulls.get(name)
        if pull is None:
            yield Held(resident, resident=True)
            return
        self.fetch_ahead(name, shard)
        if pull.fetch(shard, wait=True):
            yield Held(resident, resident=True)
            return
        with pull.window.holding(shard, direct) as held:
            yield held

    def resident(self, name: str, shard: int) -> bool:
        """Whether shard of name is on local disk now (a cache not being pulled: all are)."""
        with self._lock:
            pull = self._pulls.get(name)
        return pull is None or pull.resident_now(shard)

    def plan(self, name: str, lease: str, order: list[int]) -> None:
        """A pass over name reads order's shards in that order (its read lease says so):
        its streamed shards are fetched ahead of it, the first one now."""
        places = {shard: at for at, shard in enumerate(order)}
        with self._lock:
            self._plans.setdefault(name, {})[lease] = (order, places)
        if order:
            self.fetch_ahead(name, order[0], first=True)

    def unplan(self, name: str, lease: str) -> None:
        with self._lock:
            plans = self._plans.get(name, {})
            plans.pop(lease, None)
            if not plans:
                self._plans.pop(name, None)

    def fetch_ahead(self, name: str, shard: int, first: bool = False) -> None:
        """A read of shard of name: in the order of each pass that reads it, fetch the next
        streamed shard (first: shard itself, if streamed) into the window in the
        background, before the reader asks for it."""
        with self._lock:
            pull = self._pulls.get(name)
            orders = list(self._plans.get(name, {}).values())
        if pull is None or not pull.partial:
            return
        for order, places in orders:
            at = places.get(shard)
            if at is None:
                continue
            for following in pull.next_streamed(order[at if first else at + 1 : at + 65], AHEAD):
                with contextlib.suppress(RuntimeError):  # shut down meanwhile
                    self._pullers.submit(pull.window.prefetch, following)

    def _finish(self, pull: Pull) -> None:
        """Every shard is here: the cache becomes an ordinary local, stored cache."""
        name = pull.stored.record.name
        pull.window.close()  # room came back for every shard: nothing is streamed any more
        with self._lock:
            if self._pulls.get(name) is not pull or pull.cancelled:
                return
            record = self._ready(name)
            if record is None:
                return
            record.disk_bytes = du(pull.directory)
            _Published(objects=dict(enumerate(pull.stored.objects)), stored=True).save(
                pull.directory / STATE_FILE
            )
            write_atomic(pull.directory / "manifest.json", record.to_json())
            (pull.directory / PULLING_FILE).unlink(missing_ok=True)
            del self._pulls[name]
            self._plans.pop(name, None)
            self._status[name] = StoreStatus(
                STORED, record.disk_bytes, record.disk_bytes, len(record.shards)
            )
        self._capacity.release(name)
        log.info(
            "pulled cache %r from %s: %d shards, %d bytes in %.1f s",
            name,
            self.bucket,
            len(pull.stored.objects),
            pull.stored.size,
            time.monotonic() - pull.started,
        )
