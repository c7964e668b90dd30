"""CacheInfo, and Daemons: where a cache name's calls go (one daemon, or its home in a fleet)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from client._fleet import Fleet
from client._transport import Transport, pb
from client.errors import CacheNotReadyError, ServerUnavailableError

_STATES = {pb.CACHE_STATE_WRITING: "WRITING", pb.CACHE_STATE_READY: "READY"}


@dataclass(frozen=True)
class CacheInfo:
    """What the daemon knows about one cache."""

    name: str
    state: str  # "WRITING" or "READY"
    num_elements: int
    num_shards: int
    disk_bytes: int
    raw_bytes: int
    stored_bytes: int
    fingerprint: str
    create_time: float
    commit_time: float
    pinned: bool = False
    ttl_seconds: float = 0.0  # 0: no TTL
    last_read_time: float = 0.0  # 0: never read
    hits: int = 0  # shard streams opened at a shard's first record
    direct_leases: int = 0  # same-host direct readers now (docs/direct.md)
    direct_reads: int = 0  # direct read passes since the daemon started
    #: Where the cache stands in the daemon's object store (docs/operations.md): "" without
    #: one, else LOCAL, PUBLISHING, STORED, PULLING, CONFLICT, or REMOTE (only in the store).
    store_state: str = ""
    store_done_bytes: int = 0  # of store_total_bytes, uploaded or fetched
    store_total_bytes: int = 0
    store_detail: str = ""  # why it is not stored yet (the last error), or the conflict
    #: What this daemon's calls for the cache cost the store since it started, retries
    #: included: requests by kind (GET, PUT, HEAD, LIST, DELETE), bytes in and out.
    store_requests: dict[str, int] = field(default_factory=dict)
    store_bytes_in: int = 0
    store_bytes_out: int = 0
    #: Residency (docs/operations.md, "Caches larger than the room"): the shards on the
    #: daemon's disk and their bytes (a cache larger than the daemon's room keeps some and
    #: streams the others from the store), the store bytes streamed for them, and the
    #: shard reads served resident and streamed (hit_ratio).
    resident_shards: int = 0
    resident_bytes: int = 0
    store_streamed_bytes: int = 0
    resident_reads: int = 0
    streamed_reads: int = 0
    #: The stream window now: streamed shards it holds, their bytes, reads using them.
    window_shards: int = 0
    window_bytes: int = 0
    window_reads: int = 0
    #: Of streamed_reads, those same-host readers read from the window's files themselves.
    streamed_direct_reads: int = 0

    @property
    def hit_ratio(self) -> float:
        """Of the shard reads since the daemon started, those served from resident shards
        (1.0 when none was read)."""
        total = self.resident_reads + self.streamed_reads
        return self.resident_reads / total if total else 1.0

    @property
    def compression_ratio(self) -> float:
        """Record bytes before compression / after (1.0 for an empty cache)."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 1.0

    @classmethod
    def from_proto(cls, c: pb.Cache) -> CacheInfo:
        return cls(
            c.name,
            _STATES.get(c.state, "UNSPECIFIED"),
            c.num_elements,
            c.num_shards or len(c.shards),  # a daemon without num_shards sends every shard
            c.disk_bytes,
            c.raw_bytes,
            c.stored_bytes,
            c.fingerprint,
            c.create_time,
            c.commit_time,
            c.pinned,
            c.ttl_seconds,
            c.last_read_time,
            c.hits,
            c.direct_leases,
            c.direct_reads,
            pb.StoreState.Name(c.store.state).removeprefix("STORE_STATE_") if c.store.state else "",
            c.store.done_bytes,
            c.store.total_bytes,
            c.store.detail,
            dict(c.store.requests),
            c.store.bytes_in,
            c.store.bytes_out,
            c.store.resident_shards,
            c.store.resident_bytes,
            c.store.streamed_bytes,
            c.store.resident_reads,
            c.store.streamed_reads,
            c.store.window_shards,
            c.store.window_bytes,
            c.store.window_reads,
            c.store.streamed_direct_reads,
        )


class Daemons:
    """Where a cache name's calls go: the one daemon, or the name's home member in a fleet
    (client/_fleet.py), the next member in the name's order when the home is down."""

    def __init__(self, transport: Transport | None, fleet: Fleet | None) -> None:
        assert (transport is None) != (fleet is None)
        self.transport = transport
        self.fleet = fleet

    def home(self, name: str) -> Transport:
        """The daemon that answers for cache name."""
        if self.fleet is None:
            assert self.transport is not None
            return self.transport
        return self.fleet.transport(self.fleet.owner(name, -1))

    def call(self, name: str, method: str, request: Any) -> Any:
        """A unary call to name's daemon; in a fleet, a home found down is marked so
        and the call goes to the next member in the name's order."""
        while True:
            transport = self.home(name)
            try:
                return transport.call(getattr(transport.stub, method), request)
            except ServerUnavailableError as exc:
                if self.fleet is None or all(
                    m == transport.target or self.fleet.is_down(m) for m in self.fleet.members()
                ):
                    raise
                self.fleet.mark_down(transport.target, str(exc))

    def get(self, name: str) -> pb.Cache:
        return self.call(name, "GetCache", pb.GetCacheRequest(name=name)).cache

    def ready(self, name: str, then: str, of: str = "") -> pb.Cache:
        """name's cache, READY: a WRITING one raises CacheNotReadyError saying to wait for
        its writer, then do what then says (of: words after the name, as " of the mix")."""
        cache = self.get(name)
        if cache.state != pb.CACHE_STATE_READY:
            raise CacheNotReadyError(
                f"cache {name!r}{of} is WRITING ({cache.num_elements} elements committed so "
                f"far); wait until its writer finishes, then {then}"
            )
        return cache

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        if self.transport is not None:
            self.transport.close()
