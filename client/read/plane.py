"""Remote reads over the daemon's data plane: gRPC opens the pass, TCP carries the bytes.

A pass that cannot read the daemon's files directly takes a read lease with
``data_plane=True`` (the same lease a direct reader takes: the cache counts as
being read while it lives, renewed every third of its TTL). The daemon answers
with a ticket and its data port; the pass's chunk requests then go over data
connections to that port, one request at a time per connection, at most
MAX_CONNECTIONS per pass, kept open for the pass. Each chunk is received with
``recv_into`` one buffer and decoded as a ReadShard chunk would be.

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

import logging
import os
import socket
import ssl
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

from client._transport import Transport, pb
from client.errors import InvalidArgumentError, ShardcacheError
from client.read.direct import ReadLease, _Releaser
from client.read.fetch import Ahead, Fetcher, Indices, is_run, shard_runs
from client.wire import plane
from client.wire.status import LeaseNotFound, Unauthenticated

log = logging.getLogger("client")
PLANE_ENV = "SHARDCACHE_DATA_PLANE"
#: Data connections one pass keeps to its daemon, each carrying one request at a time.
MAX_CONNECTIONS = 16
#: Seconds between tries of a data port found unreachable; gRPC carries the reads meanwhile.
REPROBE_S = 60.0
#: Most seconds a connect to the data port may take before the read goes to gRPC.
CONNECT_TIMEOUT = 3.0
#: Seconds a data connection may wait for the daemon's next bytes before it counts as lost.
RECEIVE_TIMEOUT = 120.0
_PLANES: weakref.WeakKeyDictionary[Transport, DataPlane] = weakref.WeakKeyDictionary()
_PLANES_LOCK = threading.Lock()


def enabled() -> bool:
    """$SHARDCACHE_DATA_PLANE: auto (the default) or off."""
    text = os.environ.get(PLANE_ENV, "auto").strip().lower()
    if text not in ("auto", "on", "off", "true", "false", "1", "0"):
        raise InvalidArgumentError(f"${PLANE_ENV}={text!r}: use auto or off")
    return text not in ("off", "false", "0")


def for_transport(transport: Transport) -> DataPlane:
    """The data plane of transport's daemon, one per transport and process."""
    with _PLANES_LOCK:
        found = _PLANES.get(transport)
        if found is None:
            found = _PLANES[transport] = DataPlane(transport)
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
        return (("shardcache-reason", self.reason),) if self.reason else ()


_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Refusals of a ticket the daemon no longer knows (it restarted, the lease ended).
_TICKET_GONE = (LeaseNotFound.reason, Unauthenticated.reason)


def _lost(where: str, exc: BaseException) -> PlaneStatus:
    return PlaneStatus(grpc.StatusCode.UNAVAILABLE, "",
                       f"data connection to {where} lost: {exc or type(exc).__name__}")


class DataPlane:
    """Where one daemon's data plane is, how to reach it, and whether it can be reached."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        target = transport.target.removeprefix("dns:///").removeprefix("ipv4:")
        self.host = target.removeprefix("ipv6:").rpartition(":")[0].strip("[]")
        self._tls = _client_context(transport) if transport.credentials.tls else None
        self._unreachable_until = 0.0
        self._warned = False
        self._none = not self.host or target.startswith("unix:")  # no TCP: never asked

    def lease(self, cache: pb.Cache, epoch_start: bool) -> tuple[PlaneLease | None, bool]:
        """(a lease with a ticket for one pass, or None: read over gRPC; whether the
        daemon counted the pass's hit)."""
        if self._none or not enabled():
            return None, False
        request = pb.AcquireReadLeaseRequest(name=cache.name, fingerprint=cache.fingerprint,
                                             epoch_start=epoch_start, data_plane=True)
        try:
            granted = self.transport.call(self.transport.stub.AcquireReadLease, request)
        except ShardcacheError as exc:
            if type(exc) is not ShardcacheError:  # not found, replaced, unavailable: as gRPC
                raise
            self._none = True  # a daemon without read leases
            return None, False
        release = _Releaser(self.transport, granted.lease_id)
        if not granted.ticket:  # --data-listen off, or not for this caller
            release()
            self._none = True
            return None, epoch_start
        return PlaneLease(self, release, granted), epoch_start

    def connect(self, ticket: bytes, port: int) -> socket.socket:
        """A data connection that presented ticket; PlaneStatus when it cannot be had."""
        sock = socket.create_connection((self.host, port), timeout=CONNECT_TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(RECEIVE_TIMEOUT)
            sock.sendall(plane.hello(ticket))
            kind, n, first, _ = plane.FRAME.unpack(plane.recv_bytes(sock, plane.FRAME.size))
            if kind == plane.ERROR:
                raise _error(plane.recv_bytes(sock, min(n, plane.MAX_ERROR_TEXT)), first)
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
            log.warning("cannot reach the data port %s:%d of cacheserver %s (%s); reading "
                        "over gRPC, at a fraction of the rate: open that port to this host "
                        "(docs/operations.md)", self.host, port, self.transport.target, exc)


def _error(text: bytes, code: int) -> PlaneStatus:
    reason, message = plane.parse_error(text)
    return PlaneStatus(_CODES.get(code, grpc.StatusCode.UNKNOWN), reason, message)


def _client_context(transport: Transport) -> ssl.SSLContext:
    ca, cert, key = transport.credentials.pems
    context = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if cert is not None and key is not None:
        with tempfile.NamedTemporaryFile() as chain, tempfile.NamedTemporaryFile() as secret:
            chain.write(cert)
            secret.write(key)
            chain.flush()
            secret.flush()
            context.load_cert_chain(chain.name, secret.name)
    return context


class PlaneLease:
    """One pass's lease with a ticket: its renewal, and its data connections."""

    def __init__(self, data_plane: DataPlane, release: _Releaser,
                 granted: pb.AcquireReadLeaseResponse) -> None:
        self._renewal = ReadLease(release, granted, [], [], lost="the pass reads on")
        self.plane = data_plane
        self.ticket, self.port = granted.ticket, granted.data_port
        self.where = f"{data_plane.host}:{self.port}"
        self._idle: list[socket.socket] = []
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self.worked = False  # a connection got through
        self.ended = False  # the daemon no longer knows the ticket: gRPC from now on

    def fetcher(self, transport: Transport, cache: pb.Cache, reconnect_timeout: float,
                closing: threading.Event) -> PlaneFetcher:
        return PlaneFetcher(transport, cache, reconnect_timeout, closing, self)

    def take(self) -> socket.socket:
        """A connection for one request: an idle one, else a new one."""
        self._slots.acquire()
        with self._lock:
            if self._idle:
                return self._idle.pop()
        try:
            sock = self.plane.connect(self.ticket, self.port)
        except BaseException:
            self._slots.release()
            raise
        self.worked = True
        return sock

    def give(self, sock: socket.socket, reusable: bool) -> None:
        with self._lock:
            if reusable and not self.ended:
                self._idle.append(sock)
                sock = None  # type: ignore[assignment]
        if sock is not None:
            sock.close()
        self._slots.release()

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
        self.drop_idle()
        self._renewal.close()


class PlaneFetcher(Fetcher):
    """A Fetcher whose requests go over data connections; gRPC when the plane is out."""

    def __init__(self, transport: Transport, cache: pb.Cache, reconnect_timeout: float,
                 closing: threading.Event, lease: PlaneLease) -> None:
        super().__init__(transport, cache, reconnect_timeout, closing)
        self._lease = lease

    def _attempt(self, indices: Indices, epoch_start: bool, ahead: Ahead
                 ) -> Iterator[tuple[int, int, bytes, Any]]:
        lease = self._lease
        if lease.ended or not lease.plane.reachable():
            yield from super()._attempt(indices, epoch_start, ahead)
            return
        try:
            sock = lease.take()
        except (PlaneStatus, OSError, plane.FramingError) as exc:
            if isinstance(exc, PlaneStatus) and exc.reason not in _TICKET_GONE:
                raise
            if lease.worked or isinstance(exc, PlaneStatus):  # the daemon restarted or moved
                lease.end(exc)
            else:  # never got through: a firewall, a route
                lease.plane.unreachable(lease.port, exc)
            yield from super()._attempt(indices, epoch_start, ahead)  # UNAVAILABLE if down
            return
        done = False
        try:
            yield from self._requests(sock, indices)
            done = True
        except PlaneStatus as exc:
            if exc.reason not in _TICKET_GONE:
                raise
            lease.end(exc)  # the lease ended under the pass: the rest over gRPC
            raise _lost(lease.where, exc) from exc
        except (OSError, plane.FramingError) as exc:
            lease.drop_idle()  # lost with the daemon, most likely: connect afresh
            raise _lost(lease.where, exc) from exc
        finally:
            lease.give(sock, done)

    def _requests(self, sock: socket.socket, indices: Indices
                  ) -> Iterator[tuple[int, int, bytes, Any]]:
        first = int(indices[0])
        if not is_run(indices):
            wanted = np.asarray(indices, "<u8")
            sock.sendall(plane.REQUEST.pack(plane.ELEMENTS, len(wanted), 0, 0,
                                            self.chunk_bytes) + wanted.tobytes())
            yield from self._chunks(sock, 0, None)
            return
        for shard, start, count in shard_runs(self._cache, first, first + len(indices)):
            sock.sendall(plane.REQUEST.pack(plane.SHARD, shard.index, start, count,
                                            self.chunk_bytes))
            yield from self._chunks(sock, shard.first_element - first, shard.num_elements)

    def _chunks(self, sock: socket.socket, offset: int, shard_elements: int | None
                ) -> Iterator[tuple[int, int, bytes, Any]]:
        """One request's CHUNK frames as the gRPC Fetcher's _stream gives them."""
        header = bytearray(plane.FRAME.size)
        while True:
            plane.recv_exact(sock, memoryview(header))
            kind, n, start, size = plane.FRAME.unpack(header)
            if kind == plane.END:
                return
            if kind == plane.ERROR:
                raise _error(plane.recv_bytes(sock, min(n, plane.MAX_ERROR_TEXT)), start)
            if kind != plane.CHUNK:
                raise plane.FramingError(f"frame kind {kind} in a response")
            lengths = plane.recv_bytes(sock, 4 * n)
            data = np.empty(size, np.uint8).data  # no zero fill; the decoder copies out of it
            plane.recv_exact(sock, data)
            count = n if shard_elements is None else min(n * self._k, shard_elements - start)
            yield offset + start, count, lengths, data


__all__ = ["PLANE_ENV", "DataPlane", "PlaneFetcher", "PlaneLease", "enabled", "for_transport"]
