"""A materialization operation's state: what runs, per-shard progress, snapshots.

Plain data guarded by the operation's condition variable; the materializer and
its supervisor (cacheserver/materialize/supervisor.py) drive it and the service
turns Snapshots into cacheserver.v1.Operation messages (cacheserver/rpc/operations.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cacheserver.catalog.manifest import CacheRecord
from cacheserver.materialize import worker
from client.wire import status

_CODES = {
    cls.reason: cls.code
    for cls in vars(status).values()
    if isinstance(cls, type) and issubclass(cls, status.CacheServerError)
}


def operation_name(cache: str) -> str:
    return f"materialize/{cache}"


@dataclass(frozen=True)
class Spec:
    """What a materialization runs; saved as materialize.json to resume it."""

    entry_point: str
    graph_def: bytes
    element_spec: bytes
    num_shards: int
    workers: int
    fingerprint: str
    #: Raw bytes per block of small fixed-shape elements; None: the workers' default.
    block_bytes: int | None = None

    def to_json(self) -> str:
        doc = asdict(self)
        doc["graph_def"] = base64.b64encode(self.graph_def).decode()
        doc["element_spec"] = base64.b64encode(self.element_spec).decode()
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> Spec:
        doc = json.loads(text)
        doc["graph_def"] = base64.b64decode(doc["graph_def"])
        doc["element_spec"] = base64.b64decode(doc["element_spec"])
        return cls(**doc)

    def same_source(self, other: Spec) -> bool:
        return (
            self.entry_point,
            self.graph_def,
            self.num_shards,
            self.fingerprint,
            self.block_bytes,
        ) == (
            other.entry_point,
            other.graph_def,
            other.num_shards,
            other.fingerprint,
            other.block_bytes,
        )


@dataclass(frozen=True)
class OperationError:
    reason: str
    message: str
    shard: int = -1

    @property
    def code(self) -> Any:
        return _CODES.get(self.reason, status.CacheServerError.code)


@dataclass(frozen=True)
class Snapshot:
    """An operation's progress at one moment."""

    name: str
    cache: str
    state: str  # RUNNING | SUCCEEDED | FAILED | CANCELLED
    done: bool
    shards_total: int
    shards_done: int
    shards_resumed: int
    elements: int
    raw_bytes: int
    stored_bytes: int
    bytes_per_second: float
    elements_per_second: float
    eta_seconds: float
    start_time: float
    end_time: float
    workers: int
    shard_errors: tuple[OperationError, ...]
    error: OperationError | None


@dataclass
class ShardProgress:
    elements: int = 0
    raw_bytes: int = 0
    stored_bytes: int = 0
    layout_json: str = ""
    element_spec: bytes = b""


@dataclass
class Operation:
    spec: Spec
    record: CacheRecord
    workers: int
    committed: dict[int, ShardProgress] = field(default_factory=dict)
    running: dict[int, ShardProgress] = field(default_factory=dict)
    #: Shards kept from an interrupted run (committed before this run started).
    resumed_shards: set[int] = field(default_factory=set)
    state: str = "RUNNING"
    done: bool = False
    error: OperationError | None = None
    shard_errors: list[OperationError] = field(default_factory=list)
    reference: tuple[int, str, bytes] | None = None  # (shard, layout_json, element_spec)
    start_time: float = field(default_factory=time.time)
    end_time: float = 0.0
    shutting_down: bool = False
    version: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    stop: Any = None  # a multiprocessing Event, set to stop the workers
    thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return operation_name(self.record.name)

    @property
    def resumed(self) -> int:
        return len(self.resumed_shards)

    def changed(self) -> None:
        """Call with cond held: wakes watchers."""
        self.version += 1
        self.cond.notify_all()

    def fail(self, error: OperationError, state: str = "FAILED") -> None:
        """Call with cond held: the first failure wins; stops the workers."""
        if self.state == "RUNNING":
            self.state, self.error = state, error
            if self.stop is not None:
                self.stop.set()
            self.changed()

    def snapshot(self) -> Snapshot:
        with self.cond:
            shards = [*self.committed.values(), *self.running.values()]
            fresh = [s for i, s in self.committed.items() if i not in self.resumed_shards]
            fresh += list(self.running.values())
            elapsed = max((self.end_time or time.time()) - self.start_time, 1e-6)
            done_now = len(self.committed) - self.resumed
            left = self.spec.num_shards - len(self.committed)
            eta = -1.0 if done_now == 0 else elapsed * left / done_now
            if self.done:
                eta = 0.0
            return Snapshot(
                self.name,
                self.record.name,
                self.state,
                self.done,
                self.spec.num_shards,
                len(self.committed),
                self.resumed,
                sum(s.elements for s in shards),
                sum(s.raw_bytes for s in shards),
                sum(s.stored_bytes for s in shards),
                sum(s.stored_bytes for s in fresh) / elapsed,
                sum(s.elements for s in fresh) / elapsed,
                eta,
                self.start_time,
                self.end_time,
                self.workers,
                tuple(self.shard_errors),
                self.error,
            )


def committed_shard(directory: Path, index: int) -> ShardProgress | None:
    marker = worker.marker_path(directory, index)
    if not marker.exists() or not worker.shard_path(directory, index).is_dir():
        return None
    try:
        doc = json.loads(marker.read_text())
        return ShardProgress(
            doc["num_elements"],
            doc["raw_bytes"],
            doc["stored_bytes"],
            doc["layout_json"],
            base64.b64decode(doc["element_spec"]),
        )
    except (OSError, ValueError, KeyError):
        return None


def graph_fingerprint(graph_def: bytes) -> str:
    return f"graph:{hashlib.sha256(graph_def).hexdigest()[:16]}"


def source_fingerprint(entry_point: str, graph_def: bytes, num_shards: int, given: str = "") -> str:
    """A materialized cache's fingerprint: its source's (given, else the entry point's or
    the graph's) and its shard count, which orders the elements."""
    source = given or (f"entry:{entry_point}" if entry_point else graph_fingerprint(graph_def))
    return f"{source}/shards={num_shards}"


def describe(spec: Spec) -> str:
    source = spec.entry_point or f"a dataset graph ({len(spec.graph_def):,} bytes)"
    blocks = "" if spec.block_bytes is None else f", blocks of {spec.block_bytes:,} bytes"
    return f"{source} in {spec.num_shards} shards{blocks}"


def leaves(layout_json: str) -> str:
    try:
        return json.dumps(json.loads(layout_json).get("leaves", layout_json))
    except (ValueError, AttributeError):
        return layout_json
