"""Several daemons as one cache: members, rendezvous placement, members found down.

``CacheClient(targets=[...])`` reads from a fleet: the daemons of a cluster over
one object store (``serve --store``). Membership is whatever the targets name:
fixed addresses, or ``dns:///NAME:PORT``, every address NAME resolves to (the
headless Service of the DaemonSet), resolved again every few seconds
(``$SHARDCACHE_RESOLVE_SECONDS``) as Kubernetes changes the endpoints. There
is no membership service.

**Placement.** Shard s of cache c is owned by the member with the highest
``hash(member, c, s)`` (rendezvous, or highest-random-weight, hashing): every
client computes the same owner from the same member list, a member that joins
takes over only the shards it now wins (about 1/(N+1) of them, none moving
between the others), and one that leaves hands each of its shards to that
shard's next member in the same order. A cache's catalog calls (GetCache,
writes, retention) go to the owner of (c, -1), its *home*.

**Members found down.** A call that fails with UNAVAILABLE marks its member
down for ``DOWN_SECONDS``; placement skips it meanwhile (the next member in the
shard's order serves), then tries it again, so a member that comes back takes
its shards back for new reads. Channels send keepalive pings, so a member
whose network link is gone fails its calls within seconds instead of hanging.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from client import settings
from client._transport import Credentials, Transport, pb
from client.errors import InvalidArgumentError, ServerUnavailableError

log = logging.getLogger("client")
#: A member whose call failed with UNAVAILABLE is skipped for this long.
DOWN_SECONDS = 5.0
_DNS = "dns:///"
#: Streams one client keeps open to one member at most: well under the daemon's
#: --max-streams-per-client (48 by default), which every process of a host shares.
STREAMS_PER_MEMBER = 8
#: Keepalive: a member whose link is gone is found within ~2 x this (the daemon allows it).
KEEPALIVE_MS = 3000
_FLEET_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
    ("grpc.http2.max_pings_without_data", 0),
]


def weight(member: str, cache: str, shard: int) -> int:
    """Rendezvous weight of member for (cache, shard): the highest owns it."""
    key = f"{member}\0{cache}\0{shard}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def ranked(members: Sequence[str], cache: str, shard: int) -> list[str]:
    """members, the owner of (cache, shard) first, then its successors in order."""
    return sorted(members, key=lambda m: weight(m, cache, shard), reverse=True)


def routed(cache: pb.Cache) -> bool:
    """Whether the fleet reads cache shard by shard from the owners: once the store
    holds it (each owner pulls its shards from there). Before, its home serves it all."""
    return cache.store.state in (
        pb.STORE_STATE_STORED,
        pb.STORE_STATE_PULLING,
        pb.STORE_STATE_REMOTE,
    )


def parse_targets(targets: str | Sequence[str]) -> list[str]:
    """The targets as a list: a string is comma-separated; checked."""
    items = targets.split(",") if isinstance(targets, str) else list(targets)
    items = [t.strip() for t in items if t.strip()]
    if not items:
        raise InvalidArgumentError(
            "targets is empty: name at least one daemon, host:port or dns:///NAME:PORT"
        )
    for item in items:
        if item.startswith(_DNS):
            _host_port(item[len(_DNS) :], item)
    return items


def _host_port(text: str, item: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"target {item!r}: a dns:/// target is dns:///NAME:PORT")
    return host.strip("[]"), int(port)


def _resolve(item: str) -> list[str]:
    """The members item names: itself, or every address its DNS name has now."""
    if not item.startswith(_DNS):
        return [item]
    host, port = _host_port(item[len(_DNS) :], item)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []  # no endpoints right now (a Service with no ready pods): none from it
    found = set()
    for family, _, _, _, address in infos:
        ip = address[0]
        found.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return sorted(found)


class Fleet:
    """The members of a fleet, a Transport to each, and which of them are down;
    thread-safe."""

    def __init__(
        self, targets: Sequence[str], connect_timeout: float, credentials: Credentials
    ) -> None:
        self.targets = list(targets)
        self._connect_timeout = connect_timeout
        self._credentials = credentials
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._down: dict[str, float] = {}
        self._permits: dict[str, threading.BoundedSemaphore] = {}
        #: (cache, shard) -> its members in rendezvous order, for the members now
        self._orders: dict[tuple[str, int], list[str]] = {}
        self._members: list[str] = []
        self._refresh = settings.RESOLVE_SECONDS.get()
        self._resolved_at = -self._refresh
        self._dynamic = any(t.startswith(_DNS) for t in self.targets)

    def __repr__(self) -> str:
        return ",".join(self.targets)

    def members(self) -> list[str]:
        """Every member, live or down, sorted; DNS names resolved again when due."""
        return list(self._current()[0])

    def _current(self) -> tuple[list[str], dict[tuple[str, int], list[str]]]:
        """The members and the rendezvous orders computed for them so far."""
        now = time.monotonic()
        with self._lock:
            if not self._members or (self._dynamic and now - self._resolved_at >= self._refresh):
                found = sorted({m for t in self.targets for m in _resolve(t)})
                if found != self._members and (found or not self._members):
                    self._members = found  # (a failed lookup keeps the last answer)
                    self._orders = {}
                self._resolved_at = now
            return self._members, self._orders

    def live(self, members: Sequence[str]) -> list[str]:
        """members without those marked down (all of them when every one is)."""
        now = time.monotonic()
        with self._lock:
            up = [m for m in members if self._down.get(m, 0.0) <= now]
        return up or list(members)

    def owner(self, cache: str, shard: int) -> str:
        """The live member that serves shard of cache (-1: the cache's home)."""
        members, orders = self._current()
        if not members:
            raise ServerUnavailableError(
                f"no cacheserver found for targets {self!r}: the DNS name resolves to no "
                "address (a headless Service with no ready pods?)"
            )
        order = orders.get((cache, shard))
        if order is None:
            order = orders[(cache, shard)] = ranked(members, cache, shard)
        return self.live(order)[0]

    def transport(self, member: str) -> Transport:
        with self._lock:
            transport = self._transports.get(member)
            if transport is None:
                transport = self._transports[member] = Transport(
                    member,
                    self._connect_timeout,
                    credentials=self._credentials,
                    options=_FLEET_OPTIONS,
                    wait_connect=False,
                )
            return transport

    def permits(self, member: str) -> threading.BoundedSemaphore:
        """One per stream open to member (STREAMS_PER_MEMBER): take one before a call."""
        with self._lock:
            permits = self._permits.get(member)
            if permits is None:
                permits = self._permits[member] = threading.BoundedSemaphore(STREAMS_PER_MEMBER)
            return permits

    def is_down(self, member: str) -> bool:
        with self._lock:
            return self._down.get(member, 0.0) > time.monotonic()

    def mark_down(self, member: str, why: str) -> None:
        with self._lock:
            known = self._down.get(member, 0.0) > time.monotonic()
            self._down[member] = time.monotonic() + DOWN_SECONDS
        if not known:
            log.warning(
                "cacheserver %s is unavailable (%s); its shards are read from the "
                "next members in their order, and it is tried again in %gs",
                member,
                why,
                DOWN_SECONDS,
            )

    @contextlib.contextmanager
    def watching(self, member: str) -> Iterator[None]:
        """Marks member down when a call to it inside fails with UNAVAILABLE."""
        try:
            yield
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                self.mark_down(member, err.details())  # type: ignore[attr-defined]
            raise

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for transport in transports:
            transport.close()


__all__ = ["Fleet", "parse_targets", "ranked", "routed", "weight"]
