"""What changes about a cache after it is committed: pin, TTL, last read, hits.

The manifest is immutable, so this lives beside it in ``retention.json``,
replaced atomically. Pin and TTL changes are fsynced (an operator's decision
must survive a crash); read statistics are written without fsync when a
stream ends (a crash may lose the last few, which only shifts LRU order).
Reader counts are in memory only: a restarted daemon has no readers.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from client.wire.status import DiskFull

FILE = "retention.json"
#: A read's end rewrites the file when it counted a hit, else at most this often (seconds):
#: the last read time on disk lags by as much after a crash (memory has it exact).
SAVE_READS_EVERY = 10.0


@dataclass
class Retention:
    pinned: bool = False
    ttl_seconds: float = 0.0
    last_read_time: float = 0.0
    hits: int = 0

    def expired(self, committed: float, now: float) -> bool:
        """True when a TTL is set and the cache has been idle longer than it."""
        idle_since = max(committed, self.last_read_time)
        return self.ttl_seconds > 0 and now - idle_since > self.ttl_seconds


class RetentionBook:
    """Retention of every cache plus who is reading what (thread-safe)."""

    def __init__(self, caches_dir: Path, write: Callable[[Path, str, bool], None]) -> None:
        self._dir = caches_dir
        self._write = write
        self._lock = threading.Lock()
        self._by_name: dict[str, Retention] = {}
        self._readers: Counter[str] = Counter()
        self._saved: dict[str, tuple[float, int]] = {}  # (when, hits) of the last write

    def load(self, name: str) -> None:
        path = self._dir / name / FILE
        try:
            doc = json.loads(path.read_text())
            value = Retention(**{k: doc[k] for k in asdict(Retention()) if k in doc})
        except FileNotFoundError:
            value = Retention()
        except (ValueError, TypeError):  # damaged: keep the cache, forget its statistics
            value = Retention()
        with self._lock:
            self._by_name[name] = value

    def get(self, name: str) -> Retention:
        with self._lock:
            return Retention(**asdict(self._by_name.get(name, Retention())))

    def forget(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)
            self._saved.pop(name, None)

    def update(self, name: str, pinned: bool | None, ttl_seconds: float | None) -> Retention:
        with self._lock:
            value = self._by_name.setdefault(name, Retention())
            if pinned is not None:
                value.pinned = pinned
            if ttl_seconds is not None:
                value.ttl_seconds = ttl_seconds
            snapshot = Retention(**asdict(value))
        self._write(self._dir / name / FILE, json.dumps(asdict(snapshot)), True)
        return snapshot

    def readers(self, name: str) -> int:
        with self._lock:
            return self._readers[name]

    def begin_read(self, name: str, now: float, hit: bool) -> None:
        with self._lock:
            self._readers[name] += 1
            value = self._by_name.setdefault(name, Retention())
            value.last_read_time = now
            value.hits += int(hit)

    def end_read(self, name: str, now: float) -> None:
        with self._lock:
            self._readers[name] -= 1
            if not self._readers[name]:
                del self._readers[name]
            value = self._by_name.get(name)
            if value is None:  # deleted while being read
                return
            value.last_read_time = now
            saved_at, saved_hits = self._saved.get(name, (0.0, -1))
            if value.hits == saved_hits and now - saved_at < SAVE_READS_EVERY:
                return  # chunked reads end a call every few MiB: the time alone can wait
            self._saved[name] = (now, value.hits)
            snapshot = Retention(**asdict(value))
        # deleted meanwhile, or a full disk: statistics are best effort
        with contextlib.suppress(OSError, DiskFull):
            self._write(self._dir / name / FILE, json.dumps(asdict(snapshot)), False)
