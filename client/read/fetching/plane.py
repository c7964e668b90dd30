"""Remote reads over the daemon's data plane: gRPC opens the pass, TCP carries the bytes.

A pass that cannot read the daemon's files directly takes a read lease with
``data_plane=True`` (the same lease a direct reader takes: the cache counts as
being read while it lives, renewed every third of its TTL). The daemon answers
with a ticket and its data port; the pass's chunk requests then go over data
connections to that port, one request at a time per connection, at most
MAX_CONNECTIONS per pass, kept open for the pass. A chunk of values the batch being
filled can take as they are (raw records of fixed-shape numbers, one element each:
client/read/assembly/landing.py) is received with ``recvmsg_into`` straight into the
batch's rows, each value's header apart, and checked there; any other chunk is received
into one buffer and decoded as a ReadShard chunk would be.

What stays on gRPC: a daemon without a data plane (--data-listen off, a unix
socket), ``$SHARDCACHE_DATA_PLANE=off``, and a data port that cannot be reached
(a firewall passing only gRPC's port): that is logged once per daemon, the
daemon counts it (shardcache_data_fallbacks_total), and the port is tried again
after REPROBE_S seconds. A data connection lost mid-chunk is a lost daemon, as a
failed gRPC stream is: the fetcher's reconnect loop asks again for what did not
arrive. A ticket the daemon no longer knows (it restarted) ends the plane for
the pass: the rest of it reads over gRPC, the next pass takes a new ticket.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import grpc
import numpy as np

from client import settings
from client._transport import Transport, pb
from client.errors import ServerUnavailableError
from client.format.codec import Empty
from client.read.fetching import lease as read_lease
from client.read.fetching.fetch import (
    Indices,
    Land,
    Landed,
    Piece,
    Stateless,
    is_run,
    shard_runs,
    shifted,
)
from client.read.fetching.rpc import GrpcFetcher
from client.wire import plane
from client.wire.limits import MAX_ERROR_TEXT
from client.wire.status import REASON_KEY, LeaseNotFound, TooManyStreams, Unauthenticated

log = logging.getLogger("client")
#: Data connections one pass keeps to its daemon, each carrying one request at a time.
MAX_CONNECTIONS = 16
#: Seconds between tries of a data port found unreachable; gRPC carries the reads meanwhile.
REPROBE_S = 60.0
#: Most seconds a connect to the data port may take before the read goes to gRPC.
CONNECT_TIMEOUT = 3.0
#: Seconds a data connection may wait for the daemon's next bytes before it counts as lost.
RECEIVE_TIMEOUT = 120.0
#: Seconds after which a data connection over a link that went down counts as lost.
KEEPALIVE_S = 7
_PLANES: weakref.WeakKeyDictionary[Transport, DataPort] = weakref.WeakKeyDictionary()
_PLANES_LOCK = threading.Lock()


def enabled() -> bool:
    """$SHARDCACHE_DATA_PLANE: auto (the default) or off."""
    return settings.DATA_PLANE.get() is not False


def for_transport(transport: Transport) -> DataPort:
    """The data plane of transport's daemon, one per transport and process."""
    with _PLANES_LOCK:
        found = _PLANES.get(transport)
        if found is None:
            found = _PLANES[transport] = DataPort(transport)
        return found


class PlaneStatus(grpc.RpcError):
    """A data-plane failure in the shape of a failed gRPC call, so the fetcher's error
    handling (client/errors.py from_rpc_error, reconnect on UNAVAILABLE) takes it as is."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self._code, self.reason, self._message = code, reason, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((REASON_KEY, self.reason),) if self.reason else ()


_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Refusals of a ticket the daemon no longer knows (it restarted, the lease ended).
_TICKET_GONE = (LeaseNotFound.reason, Unauthenticated.reason)


def _lost(where: str, exc: BaseException) -> PlaneStatus:
    return PlaneStatus(
        grpc.StatusCode.UNAVAILABLE,
        "",
        f"data connection to {where} lost: {exc or type(exc).__name__}",
    )


class DataPort:
    """Where one daemon's data plane is, how to reach it, and whether it can be reached."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        target = transport.target.removeprefix("dns:///").removeprefix("ipv4:")
        self.host = target.removeprefix("ipv6:").rpartition(":")[0].strip("[]")
        self._tls = _client_context(transport) if transport.credentials.tls else None
        self._unreachable_until = 0.0
        self._warned = False
        self._none = not self.host or target.startswith("unix:")  # no TCP: never asked

    def lease(self, cache: pb.Cache, empty: Empty | None = None) -> PlaneLease | None:
        """A lease with a ticket for one pass, or None: read over gRPC. Its requests
        count the pass's hit (plane.EPOCH_START), not the lease. empty: makes the arrays
        chunks are received into (the pass's Buffers.empty: reused, so a warm pass writes
        into memory already faulted in; fresh ones otherwise)."""
        if self._none or not enabled():
            return None
        try:
            lease = read_lease.acquire(self.transport, cache, data_plane=True)
        except ServerUnavailableError:
            return None  # down now: the pass's gRPC calls wait for it (reconnect_timeout)
        except read_lease.NotGranted:
            self._none = True  # a daemon without read leases
            return None
        if not lease.granted.ticket:  # --data-listen off, or not for this caller
            lease.release()
            self._none = True
            return None
        lease.renew_in_background("the pass reads on")
        return PlaneLease(self, lease, empty)

    def connect(self, ticket: bytes, port: int) -> socket.socket:
        """A data connection that presented ticket; PlaneStatus when it cannot be had."""
        sock = socket.create_connection((self.host, port), timeout=CONNECT_TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(RECEIVE_TIMEOUT)
            sock.sendall(plane.hello(ticket))
            kind, n, first, _ = plane.FRAME.unpack(plane.recv_bytes(sock, plane.FRAME.size))
            if kind == plane.ERROR:
                raise _error(sock, n, first)
            if kind != plane.OK:
                raise plane.FramingError(f"frame kind {kind} instead of OK")
            return sock
        except BaseException:
            sock.close()
            raise

    def reachable(self) -> bool:
        return time.monotonic() >= self._unreachable_until

    def unreachable(self, port: int, exc: BaseException) -> None:
        """The port cannot be reached: gRPC for REPROBE_S seconds, said once."""
        self._unreachable_until = time.monotonic() + REPROBE_S
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot reach the data port %s:%d of cacheserver %s (%s); reading "
                "over gRPC, at a fraction of the rate: open that port to this host "
                "(docs/operations.md)",
                self.host,
                port,
                self.transport.target,
                exc,
            )


def keepalive(sock: socket.socket) -> None:
    """Find a lost link within ~KEEPALIVE_S seconds, as the fleet's gRPC keepalive does, also
    while the daemon is busy (a shard pulled from the store before its first chunk):
    TCP keepalive probes when nothing is in flight, a user timeout when a request is."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, KEEPALIVE_S * 1000)


def _error(sock: socket.socket, size: int, code: int) -> PlaneStatus:
    """The status of the ERROR frame whose header said size and code: its text read."""
    reason, message = plane.parse_error(plane.recv_bytes(sock, min(size, MAX_ERROR_TEXT)))
    return PlaneStatus(_CODES.get(code, grpc.StatusCode.UNKNOWN), reason, message)


def _client_context(transport: Transport) -> ssl.SSLContext:
    ca, cert, key = transport.credentials.pems
    context = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if cert is not None and key is not None:
        plane.load_cert_chain(context, cert, key)
    return context


class Ask(NamedTuple):
    """A request on a data connection, and where its chunks may land (None: nowhere).
    A CHUNK of values at first holds min(values x per, limit - first) elements: a
    SHARD request's answer is blocks of k (per) of a shard of limit elements, an
    ELEMENTS request's one element each."""

    request: bytes
    land: Land | None = None
    per: int = 1
    limit: int = 1 << 62


class PlaneLease:
    """One pass's lease with a ticket: its renewal, and its data connections."""

    def __init__(self, port: DataPort, lease: read_lease.Lease, empty: Empty | None = None) -> None:
        self._lease = lease
        self._empty = empty or _fresh
        self.plane = port
        self.ticket, self.port = lease.granted.ticket, lease.granted.data_port
        self.where = f"{port.host}:{self.port}"
        self._idle: list[socket.socket] = []
        self._busy: set[socket.socket] = set()
        self.closed = False
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self.worked = False  # a connection got through
        self.ended = False  # the daemon no longer knows the ticket: gRPC from now on

    def take(self) -> socket.socket:
        """A connection for one request: an idle one, else a new one."""
        self._slots.acquire()
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            try:
                sock = self.plane.connect(self.ticket, self.port)
            except BaseException:
                self._slots.release()
                raise
            self.worked = True
        with self._lock:
            self._busy.add(sock)
        return sock

    def give(self, sock: socket.socket, reusable: bool) -> None:
        with self._lock:
            self._busy.discard(sock)
            if reusable and not self.ended and not self.closed:
                self._idle.append(sock)
                sock = None  # type: ignore[assignment]
        if sock is not None:
            sock.close()
        self._slots.release()

    def connection(self) -> socket.socket | None:
        """A connection for the next requests, or None: send them over gRPC (the plane is
        out for this pass, or unreachable for now: said once)."""
        if self.ended or not self.plane.reachable():
            return None
        try:
            return self.take()
        except (PlaneStatus, OSError, plane.FramingError) as exc:
            if isinstance(exc, PlaneStatus) and exc.reason == TooManyStreams.reason:
                log.debug(
                    "data plane of %s: %s; this request goes over gRPC", self.where, exc.details()
                )  # this host's other readers hold the connections
                return None
            if isinstance(exc, PlaneStatus) and exc.reason not in _TICKET_GONE:
                raise
            if self.worked or isinstance(exc, PlaneStatus):  # the daemon restarted or moved
                self.end(exc)
            else:  # never got through: a firewall, a route
                self.plane.unreachable(self.port, exc)
            return None

    def responses(
        self, sock: socket.socket, requests: Iterable[Ask]
    ) -> Iterator[tuple[int, int, int, bytes, memoryview | Landed]]:
        """Send requests one by one on sock (from connection()), yielding (request number,
        first, values, u32 lengths, data) for each CHUNK of their answers; sock goes back
        to the lease at the end. Each request comes with where its chunks may land (an
        Ask's land, taking the CHUNK's first): data is then the Landed. A lost
        connection raises UNAVAILABLE (the caller asks again), a ticket the daemon no
        longer knows too, after ending the plane for the pass; other ERROR frames raise
        their status."""
        done = False
        try:
            for number, ask in enumerate(requests):
                sock.sendall(ask.request)
                for chunk in _chunks(sock, self._empty, ask):
                    yield (number, *chunk)
            done = True
        except PlaneStatus as exc:
            if exc.reason not in _TICKET_GONE:
                raise
            self.end(exc)  # the lease ended under the pass: the rest over gRPC
            raise _lost(self.where, exc) from exc
        except (OSError, plane.FramingError) as exc:
            self.drop_idle()  # lost with the daemon, most likely: connect afresh
            raise _lost(self.where, exc) from exc
        finally:
            self.give(sock, done)

    def end(self, why: BaseException) -> None:
        """The rest of the pass reads over gRPC (the daemon restarted, the lease ended)."""
        if not self.ended:
            self.ended = True
            log.info("data plane of %s: %s; the pass reads on over gRPC", self.where, why)
        self.drop_idle()

    def drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def close(self) -> None:
        """End the pass: connections closed (a request waiting on one ends at once), the
        lease released."""
        with self._lock:
            self.closed = True
            busy = list(self._busy)
        for sock in busy:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.drop_idle()
        self._lease.release()


class PlaneFetcher:
    """A Remote whose requests go over data connections; gRPC's when the plane is out for
    the pass. Owns the pass's lease."""

    path = "plane"

    def __init__(self, lease: PlaneLease, grpc_fetcher: GrpcFetcher) -> None:
        self._lease = lease
        self._grpc = grpc_fetcher
        self._cache = grpc_fetcher.cache
        self.target = grpc_fetcher.target
        self.lost_level = grpc_fetcher.lost_level

    def request(self) -> Stateless:
        return Stateless(self.attempt)

    def failed(self) -> None:
        self._lease.close()  # the read ends here: so does its lease

    def close(self) -> None:
        self._lease.close()

    def attempt(
        self, indices: Indices, epoch_start: bool, land: Land | None = None
    ) -> Iterator[Piece]:
        lease = self._lease
        sock = lease.connection()
        if sock is None:
            yield from self._grpc.attempt(indices, epoch_start)  # UNAVAILABLE if down
            return
        flags = plane.EPOCH_START if epoch_start else 0
        first = int(indices[0])
        chunk_bytes = self._grpc.chunk_bytes
        if not is_run(indices):
            wanted = np.asarray(indices, "<u8")
            request = (
                plane.REQUEST.pack(plane.ELEMENTS, flags, len(wanted), 0, 0, chunk_bytes)
                + wanted.tobytes()
            )
            for _, position, values, lengths, data in lease.responses(sock, [Ask(request, land)]):
                yield position, values, lengths, data
            return
        runs = list(shard_runs(self._cache, first, first + len(indices)))
        k = self._grpc.k
        requests = (
            Ask(
                plane.REQUEST.pack(
                    plane.SHARD, flags if i == 0 else 0, shard.index, start, count, chunk_bytes
                ),
                shifted(land, shard.first_element - first),  # a CHUNK's first is shard-local
                k,
                shard.num_elements,
            )
            for i, (shard, start, count) in enumerate(runs)
        )
        for i, start, values, lengths, data in lease.responses(sock, requests):
            shard = runs[i][0]  # a chunk of whole blocks: Decoder trims
            yield (
                shard.first_element - first + start,
                min(values * k, shard.num_elements - start),
                lengths,
                data,
            )


class _Chunk(NamedTuple):
    """A chunk as the fields of a ReadShardResponse (client/read/fetching/fleet.py reads them)."""

    start: int
    lengths: bytes
    data: memoryview | Landed  # a fleet's requests land nothing: a memoryview


class PlaneCall:
    """One request to a fleet member over its data plane, iterated as its gRPC call would
    be (chunks with start, lengths and data); cancel() from any thread ends it."""

    def __init__(self, lease: PlaneLease, sock: socket.socket, request: bytes) -> None:
        self._sock = sock
        self._responses = lease.responses(sock, [Ask(request)])

    def __iter__(self) -> Iterator[_Chunk]:
        for _, start, _values, lengths, data in self._responses:
            yield _Chunk(start, lengths, data)

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


def _fresh(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)  # no zero fill; the decoder copies out of it


def _chunks(
    sock: socket.socket, empty: Empty, ask: Ask
) -> Iterator[tuple[int, int, bytes, memoryview | Landed]]:
    """One request's CHUNK frames until its END: (first, values, u32 lengths, data), data
    received where ask.land says (a Landed) when it takes the chunk's values, else into an
    array from empty."""
    land = ask.land
    header = bytearray(plane.FRAME.size)
    while True:
        plane.recv_exact(sock, memoryview(header))
        kind, n, first, size = plane.FRAME.unpack(header)
        if kind == plane.END:
            return
        if kind == plane.ERROR:
            raise _error(sock, n, first)
        if kind != plane.CHUNK:
            raise plane.FramingError(f"frame kind {kind} in a response")
        lengths = plane.recv_bytes(sock, 4 * n)
        if land is not None and n:
            sizes = np.frombuffer(lengths, "<u4")
            elements = min(n * ask.per, ask.limit - first)
            landed = (
                land(first, sizes, elements) if int(sizes.sum(dtype=np.int64)) == size else None
            )
            if landed is not None:
                plane.recv_parts(sock, landed.buffers())
                yield first, n, lengths, landed
                continue
        data = empty((size,), np.dtype(np.uint8)).data
        plane.recv_exact(sock, data)
        yield first, n, lengths, data


__all__ = ["Ask", "DataPort", "PlaneCall", "PlaneFetcher", "PlaneLease", "enabled", "for_transport"]
