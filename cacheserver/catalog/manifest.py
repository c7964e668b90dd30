"""What the catalog keeps on disk for each cache: its name, its record, atomic files.

A cache's record (manifest.json once READY, writing.json before) lists its
shards; docs/format.md describes the layout. Knows nothing of gRPC or LMDB.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from client.format.store import disk_full
from client.wire.status import InvalidArgument

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_LEN = 200
#: A cache's counts and byte totals, each and summed, stay below 2^63: every reader of a
#: record (the wire's uint64 fields, JSON consumers, numpy int64) can hold them.
MAX_TOTAL = (1 << 63) - 1
#: In a cache's directory while the daemon materializes it: what runs, to resume it.
MATERIALIZE_SPEC = "materialize.json"


def validate_name(name: str) -> str:
    """Return name if it is a valid cache name, else raise InvalidArgument."""
    if not name:
        raise InvalidArgument("cache name is empty; pass a name such as 'imagenet-train'")
    if len(name) > MAX_NAME_LEN:
        raise InvalidArgument(f"cache name is {len(name)} characters; the limit is {MAX_NAME_LEN}")
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"invalid cache name {name!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (no '/', no control characters)"
        )
    return name


@dataclass
class ShardInfo:
    index: int
    first_element: int
    num_elements: int
    stored_bytes: int
    raw_bytes: int


@dataclass
class CacheRecord:
    name: str
    fingerprint: str
    layout_json: str
    element_spec: bytes
    state: str  # "WRITING" | "READY"
    create_time: float
    commit_time: float = 0.0
    shards: list[ShardInfo] = field(default_factory=list)
    disk_bytes: int = 0

    @property
    def num_elements(self) -> int:
        return sum(s.num_elements for s in self.shards)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["element_spec"] = self.element_spec.hex()
        return json.dumps(doc, indent=1)

    def add_shard(self, cache_dir: Path, shard: ShardInfo) -> None:
        """Commit shard: its marker next to its directory in cache_dir, then the record's."""
        write_atomic(cache_dir / f"shard-{shard.index:05d}.json", json.dumps(asdict(shard)))
        self.shards.append(shard)

    def check(self) -> CacheRecord:
        """Raise ValueError unless every field can be encoded (on the wire, in JSON)."""
        if (
            not isinstance(self.name, str)
            or not NAME_RE.fullmatch(self.name)
            or len(self.name) > MAX_NAME_LEN
        ):
            raise ValueError(f"invalid cache name {str(self.name)[:MAX_NAME_LEN]!r}")
        if not (
            isinstance(self.fingerprint, str)
            and isinstance(self.layout_json, str)
            and isinstance(self.element_spec, bytes)
        ):
            raise ValueError("fingerprint and layout_json must be strings")
        if self.state not in ("WRITING", "READY"):
            raise ValueError(f"unknown state {str(self.state)[:20]!r}")
        for key in ("create_time", "commit_time"):
            value = getattr(self, key)
            if type(value) not in (int, float) or not math.isfinite(value):
                raise ValueError(f"{key} {value!r} is not a finite number")
        _count("disk_bytes", self.disk_bytes)
        first = 0
        for i, shard in enumerate(self.shards):
            if not isinstance(shard, ShardInfo):
                raise ValueError(f"shard {i} is not a shard record")
            for key, value in vars(shard).items():  # asdict's deep copy: 5x the time
                _count(f"shard {i} {key}", value)
            if shard.index != i or shard.first_element != first:
                raise ValueError(
                    f"shard {i} says index {shard.index}, first element "
                    f"{shard.first_element}; expected {i}, {first}"
                )
            first += shard.num_elements
        for key in ("num_elements", "stored_bytes", "raw_bytes"):
            _count(f"the cache's {key}", sum(getattr(s, key, 0) for s in self.shards))
        return self

    def commit(self, cache_dir: Path) -> None:
        """Make the cache READY: its manifest is written and synced first, and only then
        does the state change, so nothing that acts on READY caches (eviction, readers)
        can see it before the commit is durable. A record that could not be encoded
        (check) is refused with InvalidArgument, nothing committed."""
        ready = replace(self, state="READY", commit_time=time.time(), disk_bytes=du(cache_dir))
        try:
            ready.check()
        except ValueError as exc:
            raise InvalidArgument(f"cache {self.name!r} cannot be committed: {exc}") from None
        write_atomic(cache_dir / "manifest.json", ready.to_json())
        (cache_dir / "writing.json").unlink(missing_ok=True)
        self.commit_time, self.disk_bytes = ready.commit_time, ready.disk_bytes
        self.state = "READY"

    @classmethod
    def from_json(cls, text: str) -> CacheRecord:
        """Parse and check (check()) a record; ValueError saying what is wrong."""
        try:
            doc = json.loads(text)
            doc["element_spec"] = bytes.fromhex(doc["element_spec"])
            doc["shards"] = [ShardInfo(**s) for s in doc["shards"]]
            return cls(**doc).check()
        except (KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None


def _count(what: str, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_TOTAL:
        raise ValueError(f"{what} is {str(value)[:40]}, not an integer from 0 to 2^63-1")


#: The temporary files write_atomic writes before its rename: a crash in between leaves one.
TEMP_FILE = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Replace path with text: a crash leaves the old file or the new one, never half of it
    (and, at worst, a temporary file: remove_temp_files)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise disk_full(path) from exc
        raise
    os.replace(tmp, path)
    if not durable:
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def du(path: Path) -> int:
    """Disk space of the regular files below path."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def remove_temp_files(directory: Path) -> int:
    """Remove what write_atomic calls left in directory when the daemon died between their
    write and rename (kill -9, a power cut); how many. Run at start, before anything
    writes."""
    removed = 0
    for path in directory.iterdir():
        if TEMP_FILE.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
    return removed
