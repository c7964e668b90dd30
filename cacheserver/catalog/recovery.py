"""Taking over a data dir at start: the exclusive lock, the scan of its caches, what it found.

One daemon per data dir: :class:`DataDirLock` holds an exclusive ``flock`` on
``<data-dir>/cacheserver.lock`` for the life of the process (the kernel drops
it when the process dies, even by kill -9, so a stale lock never blocks a
restart). A second daemon fails before it reads or changes anything. The lock
file also tells an operator which pid holds it.

A data dir on a read-only filesystem fails here too, with the reason, instead
of later on the first write.

The scan (:meth:`Recovered.scan`) keeps every READY cache, notes the broken ones
(a manifest that cannot be read), keeps interrupted materializations WRITING for
the materializer to resume, and removes every other cache directory: a write
whose writer is gone. In what it keeps it removes the temporary files of
manifest and retention updates a crash interrupted (manifest.remove_temp_files).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cacheserver.catalog.manifest import (
    MATERIALIZE_SPEC,
    CacheRecord,
    remove_temp_files,
    validate_name,
)
from cacheserver.logs import shown
from client.wire.status import InvalidArgument

log = logging.getLogger(__name__)
LOCK_FILE = "cacheserver.lock"


class DataDirError(RuntimeError):
    """The data dir cannot be used: held by another daemon, read-only, not writable."""


class DataDirLock:
    """An exclusive, process-lifetime lock on one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise DataDirError(
                    f"data dir {data_dir} is on a read-only filesystem: mount it read-write or "
                    "pass another --data-dir"
                ) from exc
            raise DataDirError(
                f"cannot use data dir {data_dir}: {exc.strerror} "
                f"({exc.filename}); check its owner and mode"
            ) from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise DataDirError(
                    f"data dir {data_dir} is in use by another cacheserver (pid {holder}, lock "
                    f"{self.path}); stop it first or pass another --data-dir"
                ) from None
            raise DataDirError(f"cannot lock {self.path}: {exc.strerror}") from exc
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def _du(path: Path) -> int:
    try:
        return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


@dataclass
class RecoveryReport:
    """What the data dir held at start, and the one line saying what recovery made of it."""

    dirs: dict[str, int]  # cache directory without a manifest -> bytes on disk
    trash_bytes: int

    @classmethod
    def survey(cls, caches_dir: Path, trash: Path) -> RecoveryReport:
        """The bytes of what the scan may discard: the directories without a manifest (a
        READY cache's size is in its manifest: walking its files cost ~0.2 ms a shard)."""
        return cls(
            {
                d.name: _du(d)
                for d in sorted(caches_dir.iterdir())
                if d.is_dir() and not (d / "manifest.json").exists()
            },
            _du(trash),
        )

    def log(self, data_dir: Path, kept: dict[str, int], temp_files: int) -> None:
        """Log what was kept (name -> bytes) and what the scan discarded."""
        discarded = {n: b for n, b in self.dirs.items() if n not in kept}
        log.info(
            "recovered %s: kept %d caches (%d bytes), discarded %d interrupted writes "
            "(%d bytes), emptied trash (%d bytes), removed %d temporary files of interrupted "
            "updates",
            data_dir,
            len(kept),
            sum(kept.values()),
            len(discarded),
            sum(discarded.values()),
            self.trash_bytes,
            temp_files,
        )


def _is_cache_name(name: str) -> bool:
    try:
        validate_name(name)
    except InvalidArgument:
        return False
    return True


@dataclass
class Recovered:
    """The caches the scan of a data dir kept."""

    #: READY caches, and the interrupted materializations (WRITING).
    caches: dict[str, CacheRecord] = field(default_factory=dict)
    #: Caches whose manifest cannot be read: name -> what is wrong.
    broken: dict[str, str] = field(default_factory=dict)
    #: Materializations a crash interrupted: kept WRITING for the materializer to resume.
    interrupted: list[CacheRecord] = field(default_factory=list)
    #: Temporary files of manifest and retention updates a crash interrupted, removed.
    temp_files: int = 0

    @classmethod
    def scan(cls, caches_dir: Path, remove: Callable[[Path], None]) -> Recovered:
        """Keep what caches_dir holds that is a cache; remove (remove) every other directory."""
        found = cls()
        for d in sorted(caches_dir.iterdir()):
            manifest = d / "manifest.json"
            if not d.is_dir() or not _is_cache_name(d.name):
                log.warning(
                    "ignoring %s: not a cache directory (no valid cache name)", shown(str(d))
                )
            elif manifest.exists() or found._keep_materialization(d):
                if manifest.exists():
                    found._load(d.name, manifest)
                found.temp_files += remove_temp_files(d)
            else:
                log.warning("discarding cache %r: its write was interrupted", d.name)
                remove(d)
        return found

    def _load(self, name: str, manifest: Path) -> None:
        """Load a READY cache's manifest; one that cannot be read or encoded is broken."""
        try:
            record = CacheRecord.from_json(manifest.read_text())
            if record.name != name or record.state != "READY":
                raise ValueError(f"it describes {record.state} cache {record.name!r}")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.broken[name] = f"{manifest} cannot be read ({shown(str(exc))})"
            log.warning(
                "cache %r is broken: %s; it is not listed and every call naming it "
                "fails; delete it with 'cacheserver rm %s'",
                name,
                self.broken[name],
                name,
            )
            return
        self.caches[name] = record

    def _keep_materialization(self, d: Path) -> bool:
        """Keep a cache whose materialization was interrupted, WRITING."""
        if not (d / MATERIALIZE_SPEC).exists() or not (d / "writing.json").exists():
            return False
        try:
            record = CacheRecord.from_json((d / "writing.json").read_text())
        except (OSError, ValueError, TypeError, KeyError):
            return False
        self.caches[d.name] = record
        self.interrupted.append(record)
        log.info("cache %r: materialization was interrupted; it will resume", d.name)
        return True
