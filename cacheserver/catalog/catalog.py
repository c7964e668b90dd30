"""The catalog: which caches exist, their state, their shards and write leases.

On disk, under ``<data-dir>/caches/<name>/``::

    writing.json          present while the cache is WRITING (what is being written)
    shard-00000/          one LMDB environment per shard
    shard-00000.json      the shard's commit marker, written after the shard is fsynced
    manifest.json         written last, atomically: the cache is READY
    retention.json        pin, TTL, last read, hits: what changes later (retention.py)
    materialize.json      while the daemon materializes the cache itself (what runs)

A cache without manifest.json after a restart was interrupted mid-write; its
writer is gone (the lease is the write stream), so startup discards it, unless
it holds materialize.json: then it stays WRITING and the materializer resumes it
(recovery.py). Reads of READY caches are reads.py.
Deleting renames the directory into ``<data-dir>/trash/`` first, so a
half-finished delete never looks like a cache.

A cache whose manifest cannot be read or encoded is *broken*: not listed, every
call naming it is DATA_LOSS saying which file and what to do, and delete()
removes it (a warning at startup names it).

Knows nothing of gRPC: the service layer translates its exceptions.
"""

from __future__ import annotations

import builtins
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from cacheserver import metrics
from cacheserver.catalog.capacity import Capacity, expired_names, pick_victim, retained_summary
from cacheserver.catalog.manifest import (
    MATERIALIZE_SPEC,
    CacheRecord,
    remove_temp_files,
    validate_name,
    write_atomic,
)
from cacheserver.catalog.recovery import Recovered, RecoveryReport
from cacheserver.catalog.remote import StoreTier
from cacheserver.catalog.retention import Retention, RetentionBook
from cacheserver.catalog.write_session import WriteSession
from cacheserver.logs import shown
from cacheserver.tier.bucket import Bucket
from client.format.store import ReaderPool
from client.wire.status import (
    CacheExists,
    CacheNotFound,
    CacheWriting,
    CapacityExceeded,
    DataLoss,
    FingerprintMismatch,
    InvalidArgument,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 1 << 30


class Catalog:
    """Thread-safe registry of caches under one data directory."""

    def __init__(
        self,
        data_dir: Path,
        capacity: Capacity | None = None,
        bucket: Bucket | None = None,
        *,
        pull_all: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.capacity = capacity or Capacity(data_dir)
        self.capacity.attach(self)
        self.retention = RetentionBook(data_dir / "caches", write_atomic)
        self._caches_dir = data_dir / "caches"
        self._trash = data_dir / "trash"
        self._caches_dir.mkdir(parents=True, exist_ok=True)
        self._trash.mkdir(exist_ok=True)
        self._lock = threading.RLock()
        self.shard_readers = ReaderPool()
        found = self._recover()
        self._caches: dict[str, CacheRecord] = found.caches
        #: Caches whose manifest cannot be read: name -> what is wrong.
        self._broken: dict[str, str] = found.broken
        #: Materializations a crash interrupted: kept WRITING for the materializer to resume.
        self.interrupted: list[CacheRecord] = found.interrupted
        #: The object store under this daemon's caches (serve --store), if any: remote.py.
        self.tier: StoreTier | None = None
        if bucket is not None:
            self.tier = StoreTier(
                bucket,
                self._caches_dir,
                self.capacity,
                self._ready_record,
                pull_all=pull_all,
                pinned=lambda name: self.retention.get(name).pinned,
                forget_maps=self.shard_readers.forget,
            )
            self.tier.start([r for r in self._caches.values() if r.state == "READY"])

    def close(self) -> None:
        if self.tier is not None:
            self.tier.stop()

    def _ready_record(self, name: str) -> CacheRecord | None:
        with self._lock:
            record = self._caches.get(name)
            return record if record is not None and record.state == "READY" else None

    def _from_store(self, name: str) -> CacheRecord | None:
        """Cache name from the object store (it starts pulling), or None if not there."""
        if self.tier is None:
            return None
        stored = self.tier.find(name)  # network: not under the lock
        if stored is None:
            return None
        with self._lock:
            if name in self._caches or name in self._broken:
                return self._caches.get(name)
            directory = self._caches_dir / name
            if directory.exists():  # left by an aborted delete or write; not a cache
                self._remove_dir(directory)
            record = self._caches[name] = self.tier.adopt(stored)
            self.retention.forget(name)
            return record

    def _broken_error(self, name: str) -> DataLoss:
        return DataLoss(
            f"cache {name!r} is broken: {self._broken[name]}; delete it with "
            f"'cacheserver rm {name}' (CacheClient.delete) and build it again"
        )

    def _recover(self) -> Recovered:
        """Empty the trash, scan the caches (Recovered.scan), load the retention of what
        it kept and log one summary line."""
        survey = RecoveryReport.survey(self._caches_dir, self._trash)
        shutil.rmtree(self._trash, ignore_errors=True)
        self._trash.mkdir(exist_ok=True)
        found = Recovered.scan(self._caches_dir, self._remove_dir)
        found.temp_files += remove_temp_files(self.data_dir)  # the instance token's
        for name in found.caches:
            self.retention.load(name)
        survey.log(
            self.data_dir,
            kept={n: r.disk_bytes for n, r in found.caches.items()},
            temp_files=found.temp_files,
        )
        return found

    def _remove_dir(self, d: Path) -> None:
        """Move d to the trash at once (atomic), then delete it.

        Callers hold the catalog lock only for the rename: removing a large
        cache's files must not stall every other call.
        """
        self._remove_later(self._to_trash(d))

    def _to_trash(self, d: Path) -> Path:
        target = self._trash / f"{d.name}.{uuid.uuid4().hex}"
        os.rename(d, target)
        self.shard_readers.forget(d)  # idle shard maps would keep the deleted files' space
        return target

    @staticmethod
    def _remove_later(trashed: Path) -> None:
        shutil.rmtree(trashed, ignore_errors=True)

    # ------------------------------------------------------------------ queries

    def list(self) -> list[CacheRecord]:
        with self._lock:
            return sorted(self._caches.values(), key=lambda r: r.name)

    def get(self, name: str) -> CacheRecord:
        validate_name(name)
        with self._lock:
            record = self._caches.get(name)
            if record is None and name in self._broken:
                raise self._broken_error(name)
        if record is None:
            raise CacheNotFound(f"cache {name!r} not found; list caches with 'cacheserver ls'")
        return record

    def get_ready(self, name: str, fingerprint: str = "") -> CacheRecord:
        """The READY cache name; one only in the object store starts being pulled."""
        try:
            record = self.get(name)
        except CacheNotFound:
            pulled = self._from_store(name)
            if pulled is None:
                raise
            record = pulled
        if record.state != "READY":
            raise CacheWriting(
                f"cache {name!r} is WRITING ({record.num_elements} elements so "
                "far); wait until its writer finishes"
            )
        if fingerprint and fingerprint != record.fingerprint:
            raise FingerprintMismatch(
                f"cache {name!r} was replaced (fingerprint "
                f"{record.fingerprint}, expected {fingerprint})"
            )
        return record

    def delete(self, name: str, store: bool = False) -> tuple[bool, bool]:
        """Delete a READY cache, or a broken one, and its files; with store, also its copy in
        the object store. Returns what was removed: (the local copy, the stored one)."""
        validate_name(name)
        if store and self.tier is None:
            raise InvalidArgument(
                "this daemon has no object store (serve --store); delete without --store"
            )
        try:
            trashed = self._unregister(name)
        except CacheNotFound:
            if not store:
                raise
            trashed = None
        stored = self.tier.delete(name) if store and self.tier is not None else False
        if trashed is None and not stored:
            raise CacheNotFound(f"cache {name!r} is neither on this daemon nor in the store")
        if trashed is not None:
            self._remove_later(trashed)
        return trashed is not None, stored

    def _unregister(self, name: str) -> Path:
        with self._lock:
            if self._broken.pop(name, None) is None:
                record = self.get(name)
                if record.state != "READY":
                    raise CacheWriting(
                        f"cache {name!r} is being written; wait until its "
                        "writer finishes or stops, then delete it"
                    )
                del self._caches[name]
            self._forget(name)
            return self._to_trash(self._caches_dir / name)

    def _forget(self, name: str) -> None:
        self.retention.forget(name)
        if self.tier is not None:
            self.tier.forget(name)

    # ------------------------------------------------------------------ retention

    def retention_of(self, name: str) -> Retention:
        return self.retention.get(name)

    def set_retention(
        self, name: str, pinned: bool | None, ttl_seconds: float | None
    ) -> CacheRecord:
        if ttl_seconds is not None and not ttl_seconds >= 0:
            raise InvalidArgument(f"ttl_seconds must be >= 0 (0 clears it), got {ttl_seconds}")
        with self._lock:
            record = self.get_ready(name)
            partial = self.tier.partial().get(name) if self.tier is not None else None
            if pinned and partial is not None:
                shards, _ = partial.resident()
                raise CapacityExceeded(
                    f"cache {name!r} cannot be pinned: only {shards} of its "
                    f"{len(record.shards)} shards fit in this daemon's room (the others are "
                    "streamed from the store); raise --max-bytes or free room, delete the "
                    "local copy (cacheserver rm NAME) and pin it once it is read whole"
                )
            self.retention.update(name, pinned, ttl_seconds)
        return record

    def committed_bytes(self) -> int:
        with self._lock:
            return sum(r.disk_bytes for r in self._caches.values() if r.state == "READY")

    def eviction_candidate(self, exclude: str) -> str | None:
        """The least recently read READY cache that is unpinned and unread, if any."""
        with self._lock:
            return pick_victim(self._evictable(), self.retention, exclude)

    def _evictable(self) -> builtins.list[CacheRecord]:
        """Caches the daemon may drop: all, or with a store only those the store holds."""
        if self.tier is None:
            return builtins.list(self._caches.values())
        return [r for r in self._caches.values() if self.tier.evictable(r.name)]

    def expired(self, now: float) -> builtins.list[str]:
        with self._lock:
            return expired_names(self._evictable(), self.retention, now)

    def retained_summary(self) -> str:
        with self._lock:
            return retained_summary(self._caches.values(), self.retention)

    def evict(self, name: str, reason: str) -> bool:
        """Delete a cache the daemon chose; False if it became pinned or read meanwhile."""
        with self._lock:
            record = self._caches.get(name)
            value = self.retention.get(name)
            if (
                record is None
                or record.state != "READY"
                or value.pinned
                or self.retention.readers(name)
                or (self.tier is not None and not self.tier.evictable(name))
            ):
                return False
            del self._caches[name]
            self._forget(name)
            trashed = self._to_trash(self._caches_dir / name)
        self._remove_later(trashed)  # before returning: the caller counts on the space
        metrics.EVICTIONS.labels(reason).inc()
        log.info(
            "evicted cache %r (%s): %d bytes, last read %s",
            name,
            reason,
            record.disk_bytes,
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value.last_read_time))
            if value.last_read_time
            else "never",
        )
        return True

    # ------------------------------------------------------------------ writing

    def begin_write(
        self,
        name: str,
        fingerprint: str,
        layout_json: str,
        element_spec: bytes,
        shard_bytes: int = 0,
    ) -> tuple[str, CacheRecord, WriteSession | None]:
        """Take the write lease on name, or say why not.

        Returns ("ACCEPTED", record, session), ("ALREADY_READY", record, None) or
        ("BUSY", record, None). Raises FingerprintMismatch when a READY cache of
        that name came from a different pipeline.
        """
        validate_name(name)
        if not fingerprint:
            raise InvalidArgument("fingerprint is empty")
        self._look_in_store(name)
        with self._lock:
            if name in self._broken:
                raise self._broken_error(name)
            existing = self._caches.get(name)
            if existing is not None:
                if existing.fingerprint != fingerprint:
                    raise FingerprintMismatch(
                        f"cache {name!r} holds elements of a different pipeline (fingerprint "
                        f"{existing.fingerprint}, yours {fingerprint}); delete it "
                        f"(cacheserver rm {name}, or CacheClient.delete) to rebuild it, or "
                        "use another name or version="
                    )
                decision = "ALREADY_READY" if existing.state == "READY" else "BUSY"
                return decision, existing, None
            directory = self._caches_dir / name
            if directory.exists():  # left by an aborted delete or write; not a cache
                self._remove_dir(directory)
            directory.mkdir()
            record = CacheRecord(
                name, fingerprint, layout_json, element_spec, "WRITING", time.time()
            )
            write_atomic(directory / "writing.json", record.to_json())
            self._caches[name] = record
            self.retention.forget(name)
        session = WriteSession(
            record, directory, shard_bytes or DEFAULT_SHARD_BYTES, self.capacity, self._release
        )
        return "ACCEPTED", record, session

    def _look_in_store(self, name: str) -> None:
        """Before a write: a cache this daemon lacks but the store holds is pulled (and the
        write answered ALREADY_READY or refused as another pipeline's, as for a local one).
        A store that cannot be reached does not stop the write: it is built here."""
        if self.tier is None:
            return
        with self._lock:
            if name in self._caches:  # READY or WRITING here: the local rules decide
                return
        try:
            self._from_store(name)
        except StoreUnavailable as exc:
            log.warning(
                "cache %r: the object store cannot be reached (%s); building the cache here",
                name,
                shown(str(exc), 300),
            )

    def _release(self, session: WriteSession, committed: bool) -> None:
        name = session.record.name
        self.capacity.release(name)
        if committed:
            if self.tier is not None:
                self.tier.publish(session.record)
            return
        with self._lock:
            if self._caches.get(name) is session.record:
                del self._caches[name]
            trashed = self._to_trash(self._caches_dir / name)
        self._remove_later(trashed)

    # ------------------------------------------------------------------ reading

    def begin_read(self, name: str, hit: bool) -> None:
        """Mark READY cache name as being read (reads.reading ends the mark): checked and
        marked under the lock, so eviction never takes a cache a reader was let in to."""
        with self._lock:
            self.get_ready(name)
            self.retention.begin_read(name, time.time(), hit)

    def shard_path(self, record: CacheRecord, shard: int) -> Path:
        return self._caches_dir / record.name / f"shard-{shard:05d}"

    # ------------------------------------------------------------ materializing
    # A materialized cache's directory also holds materialize.json (what runs);
    # worker processes write its shards and their markers (cacheserver/materialize/worker.py).

    def cache_dir(self, name: str) -> Path:
        return self._caches_dir / name

    def begin_materialize(
        self, name: str, fingerprint: str, spec_json: str, overwrite: bool
    ) -> CacheRecord:
        """Register name as WRITING, with spec_json saved for resuming after a crash."""
        validate_name(name)
        self._look_in_store(name)
        trashed = None
        with self._lock:
            if name in self._broken:
                raise self._broken_error(name)
            existing = self._caches.get(name)
            if existing is not None:
                if existing.state != "READY":
                    raise CacheWriting(
                        f"cache {name!r} is being written; wait until its "
                        "writer finishes, or attach with --resume"
                    )
                if not overwrite:
                    raise CacheExists(
                        f"cache {name!r} is already READY ({existing.num_elements}"
                        " elements); pass --overwrite (overwrite=True) to "
                        "rebuild it, or choose another name"
                    )
                del self._caches[name]
                self._forget(name)
                trashed = self._to_trash(self._caches_dir / name)
            directory = self._caches_dir / name
            if directory.exists():
                self._remove_dir(directory)
            directory.mkdir()
            record = CacheRecord(name, fingerprint, "", b"", "WRITING", time.time())
            try:
                write_atomic(directory / MATERIALIZE_SPEC, spec_json)
                write_atomic(directory / "writing.json", record.to_json())
            except Exception:
                self._remove_dir(directory)
                raise
            self._caches[name] = record
        if trashed is not None:
            self._remove_later(trashed)
        return record

    def commit_materialized(self, record: CacheRecord) -> CacheRecord:
        """Write the manifest of a materialized cache: it becomes READY."""
        directory = self._caches_dir / record.name
        record.commit(directory)
        (directory / MATERIALIZE_SPEC).unlink(missing_ok=True)
        self.capacity.release(record.name)  # its files now count as disk_bytes
        if self.tier is not None:
            self.tier.publish(record)
        return record

    def discard_materialized(self, record: CacheRecord) -> None:
        """Drop a failed or cancelled materialization and every file it wrote."""
        self.capacity.release(record.name)
        with self._lock:
            if self._caches.get(record.name) is not record:
                return
            del self._caches[record.name]
            trashed = self._to_trash(self._caches_dir / record.name)
        self._remove_later(trashed)
