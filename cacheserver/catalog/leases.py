"""Read leases: the daemon's record of clients reading shard files directly.

A client on the daemon's host may read a READY cache's committed shards itself
(read-only LMDB, mmap; client/read/fetching/direct.py) instead of streaming them. It first
takes a lease: while the lease lives, the cache counts as being read
(:func:`cacheserver.catalog.reads.reading`), so capacity eviction and the TTL sweeper skip it
exactly as they skip a cache read over gRPC. A lease expires ``ttl`` seconds
after it was granted or last renewed; a client killed with kill -9 stops
renewing, so its lease ends within one TTL and the cache becomes evictable.

Same host is proven, not assumed: at startup the daemon writes a random token
into ``<data-dir>/instance.token``; the lease carries the token and the paths,
and the client must read the same token back through the path it will read the
shards from (same host *and* the same view of the filesystem).

A partially resident cache's streamed shards (a cache larger than the daemon's room,
cacheserver/catalog/pulls.py) are not on the daemon's disk: the lease names them, and its
reader *holds* each one it reads (:meth:`LeaseTable.hold`): the call returns once the
cache's stream window has the shard fetched and checked, with the slot's directory, and
the slot is kept (counted as a read using it) until the reader releases it or the lease
ends, however it ends (released, expired after a kill -9, the daemon stopping, a grant
taken away). So the reader maps the slot's file as it maps resident shards, and the
daemon's share of a streamed byte is the GET and its check, not sending it again. A lease
holds at most :data:`MAX_HOLDS` shards at once, so that no reader pins the whole window.

A lease asked for with a data-plane peer also gets a *ticket*: 32 random bytes a
data connection presents (cacheserver/plane/server.py), valid while the lease
lives and only from that peer's address. Only a digest of each ticket is kept
for the lookup. Ending the lease ends the ticket, so it cannot be replayed.

Knows nothing of gRPC. See docs/direct.md and docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cacheserver import metrics
from cacheserver.catalog import reads
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.manifest import CacheRecord, write_atomic
from cacheserver.catalog.window import Held
from client.wire.status import DiskFull, InvalidArgument, LeaseNotFound, TooManyHolds

log = logging.getLogger(__name__)

TOKEN_FILE = "instance.token"
DEFAULT_TTL = 30.0
#: Streamed shards one lease may hold at once: the one a pass reads and the next (a request
#: across a shard's end), of the window's four slots.
MAX_HOLDS = 2
#: Holds being taken at once, every lease together: each waits for its shard on one of
#: the daemon's threads for unary calls (cacheserver/rpc/admission.py CONTROL_WORKERS, 16),
#: of which health checks and leases need the rest.
MAX_HOLDING = 8


@dataclass
class Lease:
    id: str
    name: str
    expires: float
    #: Ends the catalog's "being read" mark when closed.
    reading: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    fingerprint: str = ""
    #: The data-plane ticket and the address it is bound to (empty: none).
    ticket: bytes = b""
    peer: str = ""
    #: A data connection presented the ticket; or the lease's gRPC reads counted as a
    #: fallback (the ticket unused).
    presented: bool = False
    fell_back: bool = False
    #: Who took it (the RPC edge's principal): its grant is the ticket's.
    holder: object = None
    #: The shards not on local disk (a partially resident cache's streamed ones): a direct
    #: reader reads them through the daemon.
    streamed: list[int] = field(default_factory=list)
    #: The cache's shard count, and the streamed shards its reader holds (each its window
    #: slot's hold, ended by its stack), by shard; holds being taken count in pending.
    shards: int = 0
    holds: dict[int, tuple[contextlib.ExitStack, Held]] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)


def _digest(ticket: bytes) -> bytes:
    return hashlib.sha256(ticket).digest()


class LeaseTable:
    """Live read leases of one catalog; a thread ends the ones not renewed in time."""

    def __init__(self, catalog: Catalog, ttl: float = DEFAULT_TTL) -> None:
        if not ttl > 0:
            raise ValueError(f"lease TTL must be positive, got {ttl}")
        self.catalog = catalog
        self.ttl = ttl
        self.data_dir = catalog.data_dir.resolve()
        self.token_path = self.data_dir / TOKEN_FILE
        self.token = self._new_token()
        self._cond = threading.Condition()
        self._leases: dict[str, Lease] = {}
        self._granted: Counter[str] = Counter()
        self._tickets: dict[bytes, Lease] = {}  # by the ticket's digest
        self._holding = 0  # holds being taken (LeaseTable.hold), every lease together
        self._stopped = False
        self._thread = threading.Thread(target=self._expire_loop, name="lease-expiry", daemon=True)

    def _new_token(self) -> str:
        """Write this instance's token; on a full disk keep the previous run's (the same
        data dir, so it proves the same thing), else direct access stays off."""
        token = secrets.token_hex(16)
        try:
            write_atomic(self.token_path, token + "\n")
            return token
        except DiskFull:
            with contextlib.suppress(OSError):
                previous = self.token_path.read_text().strip()
                if previous:
                    log.warning(
                        "disk full: kept the previous %s for direct reads and writes",
                        self.token_path,
                    )
                    return previous
            log.warning(
                "disk full: cannot write %s; direct reads and writes fall back to "
                "gRPC until the daemon restarts with free space",
                self.token_path,
            )
            return token

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop expiring and end every lease (the daemon is going away)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        with self._cond:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            self._end(lease)

    def acquire(
        self,
        name: str,
        fingerprint: str,
        epoch_start: bool,
        shards: Sequence[int] = (),
        peer: str = "",
        holder: object = None,
        pass_shards: Sequence[int] = (),
    ) -> tuple[Lease, CacheRecord, list[Path]]:
        """Lease the READY cache name: (lease, its record, absolute shard directories).

        shards: the ones the reader reads (empty: all), on disk when this returns unless
        streamed. peer: the caller's IP address, to get a data-plane ticket bound to it.
        pass_shards: the pass's shards in its order, while the lease lives the order in
        which the daemon fetches a partially resident cache's streamed shards ahead."""
        self.catalog.get_ready(name, fingerprint)  # NOT_FOUND / WRITING / mismatch first
        lease = Lease(secrets.token_hex(16), name, 0.0, holder=holder)
        lease.reading.enter_context(reads.reading(self.catalog, name, hit=epoch_start))
        try:  # the cache may have been replaced between the check and the mark
            record = self.catalog.get_ready(name, fingerprint)
        except BaseException:
            lease.reading.close()
            raise
        with self._cond:
            if self._stopped:
                lease.reading.close()
                raise LeaseNotFound("the daemon is shutting down; read over gRPC or retry")
            lease.expires = time.monotonic() + self.ttl
            lease.fingerprint = record.fingerprint
            lease.shards = len(record.shards)
            if peer:
                lease.ticket, lease.peer = secrets.token_bytes(32), peer
                self._tickets[_digest(lease.ticket)] = lease
            self._leases[lease.id] = lease
            self._granted[name] += int(epoch_start)
            self._cond.notify_all()
        if not peer:  # a data-plane reader is not a direct one
            metrics.DIRECT_LEASES.inc()
            if epoch_start:
                metrics.DIRECT_READS.inc()
        try:  # a cache being pulled from the object store: the shards read here first
            for asked in (shards, pass_shards):
                if any(s >= len(record.shards) for s in asked):
                    raise InvalidArgument(
                        f"cache {name!r} has {len(record.shards)} shards; "
                        f"shard {max(asked)} does not exist"
                    )
            if self.catalog.tier is not None and not peer:  # data-plane reads ensure theirs
                lease.streamed = self.catalog.tier.ensure(
                    name, list(shards) or range(len(record.shards))
                )
            if self.catalog.tier is not None and pass_shards:
                self.catalog.tier.plan(name, lease.id, list(pass_shards))
                lease.reading.callback(self.catalog.tier.unplan, name, lease.id)
        except BaseException:
            self.release(lease.id)
            raise
        # the cache's directory resolved once, its shards' plain directories named in it: a
        # resolve() per shard cost ~0.15 ms each, 15 s a pass for 100,000 shards
        root = self.catalog.cache_dir(name).resolve()
        paths = [root / self.catalog.shard_path(record, s.index).name for s in record.shards]
        return lease, record, paths

    def renew(self, lease_id: str) -> float:
        """Extend the lease by the TTL; LeaseNotFound once it expired or was released."""
        with self._cond:
            self._live(lease_id).expires = time.monotonic() + self.ttl
        return self.ttl

    def release(self, lease_id: str) -> None:
        """End the lease now; an unknown (expired, released) one is ignored."""
        if not lease_id:
            raise InvalidArgument("lease_id is empty")
        with self._cond:
            lease = self._leases.pop(lease_id, None)
        if lease is not None:
            self._end(lease)

    def hold(self, lease_id: str, shard: int) -> Held:
        """Hold shard of the lease's cache for its reader: its stream window's copy, fetched
        if need be (waiting for a slot while every one is in use), kept until release_hold or
        the lease's end; a shard on local disk by then: its own directory, nothing held
        (Held.resident). Holding a shard the lease holds already answers the same hold.
        LeaseNotFound once the lease ended; TooManyHolds past MAX_HOLDS."""
        with self._cond:
            lease = self._live(lease_id)
            if not 0 <= shard < lease.shards:
                raise InvalidArgument(
                    f"cache {lease.name!r} has {lease.shards} shards; shard {shard} does not exist"
                )
            if shard in lease.holds:
                return lease.holds[shard][1]
        resident = self.catalog.shard_path(self.catalog.get_ready(lease.name), shard)
        if self.catalog.tier is None or self.catalog.tier.resident(lease.name, shard):
            return Held(resident, resident=True)  # nothing to hold: counts in no bound
        with self._cond:
            now = len(lease.holds) + len(lease.pending)
            if shard in lease.pending or now >= MAX_HOLDS:
                raise TooManyHolds(
                    f"read lease {lease_id} holds {now} streamed shards of cache "
                    f"{lease.name!r} (at most {MAX_HOLDS} at once, each once): release one "
                    "(ReleaseStreamedShard) before holding another, or read this one "
                    "through the daemon (ReadShard)"
                )
            if self._holding >= MAX_HOLDING:
                raise TooManyHolds(
                    f"the daemon is fetching {self._holding} streamed shards for direct "
                    f"readers already (at most {MAX_HOLDING} at once); read this one "
                    "through the daemon (ReadShard), or hold it again later"
                )
            lease.pending.add(shard)
            self._holding += 1
        stack = contextlib.ExitStack()
        try:  # resident by now, maybe (room came back): held_files answers so
            held = stack.enter_context(
                self.catalog.tier.held_files(lease.name, shard, resident, direct=True)
            )
        except BaseException:
            with self._cond:
                lease.pending.discard(shard)
                self._holding -= 1
            stack.close()
            raise
        with self._cond:
            lease.pending.discard(shard)
            self._holding -= 1
            alive = self._leases.get(lease.id) is lease
            if alive and not held.resident:
                lease.holds[shard] = (stack, held)
        if not alive or held.resident:
            stack.close()  # nothing to keep: resident, or the lease ended meanwhile
        if not alive:
            raise LeaseNotFound(
                f"read lease {lease_id} ended while shard {shard} was being fetched; take a "
                "new lease"
            )
        return held

    def release_hold(self, lease_id: str, shard: int, read_to_end: bool) -> None:
        """End the lease's hold of shard (read_to_end: its reader read it to its last
        element: the window drops it first); an unknown hold or lease is ignored."""
        with self._cond:
            lease = self._leases.get(lease_id)
            entry = lease.holds.pop(shard, None) if lease is not None else None
        if entry is not None:
            stack, held = entry
            held.read_to_end = read_to_end
            stack.close()

    def cache_of(self, lease_id: str) -> str:
        """The name of the cache the live lease reads; LeaseNotFound if none."""
        with self._cond:
            return self._live(lease_id).name

    def _live(self, lease_id: str) -> Lease:
        """The live lease of that id (call with the lock held); LeaseNotFound if none."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFound(
                f"read lease {lease_id or '(empty)'} expired or was released (not renewed "
                f"within {self.ttl:g}s); take a new lease to keep the cache from eviction"
            )
        return lease

    def release_where(self, ended: Callable[[Lease], bool]) -> int:
        """End every lease for which ended(lease) is true (its holder lost its grant);
        their tickets stop working at once. Returns how many ended."""
        with self._cond:
            leases = [lease for lease in self._leases.values() if ended(lease)]
            for lease in leases:
                del self._leases[lease.id]
        for lease in leases:
            self._end(lease)
        return len(leases)

    def by_ticket(self, ticket: bytes) -> Lease | None:
        """The live lease whose ticket this is, marked presented; None: unknown or ended."""
        with self._cond:
            lease = self._tickets.get(_digest(ticket))
            if lease is not None:
                lease.presented = True
            return lease

    def alive(self, lease: Lease) -> bool:
        with self._cond:
            return self._leases.get(lease.id) is lease

    def fell_back(self, peer: str, name: str) -> bool:
        """True, once per lease, when peer reads cache name over gRPC while it holds a
        ticket for it that no data connection presented: it cannot reach the data port."""
        with self._cond:
            for lease in self._tickets.values():
                if (
                    lease.peer == peer
                    and lease.name == name
                    and not lease.presented
                    and not lease.fell_back
                ):
                    lease.fell_back = True
                    return True
            return False

    def counts(self, name: str) -> tuple[int, int]:
        """(leases alive now, passes leased since start: leases with epoch_start) of name."""
        with self._cond:
            alive = sum(1 for lease in self._leases.values() if lease.name == name)
            return alive, self._granted[name]

    def _end(self, lease: Lease) -> None:
        with self._cond:  # a hold being taken meanwhile finds the lease gone and ends
            holds, lease.holds = list(lease.holds.values()), {}
        for stack, _ in holds:
            stack.close()
        if lease.ticket:
            with self._cond:
                self._tickets.pop(_digest(lease.ticket), None)
        else:
            metrics.DIRECT_LEASES.dec()
        lease.reading.close()

    def _expire_loop(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                expired = [lease for lease in self._leases.values() if lease.expires <= now]
                for lease in expired:
                    del self._leases[lease.id]
                if expired:
                    self._cond.release()
                    try:
                        for lease in expired:
                            log.info(
                                "read lease on cache %r expired: its reader stopped "
                                "renewing (killed, hung or gone)",
                                lease.name,
                            )
                            self._end(lease)
                    finally:
                        self._cond.acquire()
                    continue
                soonest = min((lease.expires for lease in self._leases.values()), default=None)
                self._cond.wait(None if soonest is None else max(soonest - now, 0.0) + 0.01)


__all__ = ["DEFAULT_TTL", "TOKEN_FILE", "Lease", "LeaseTable"]
