"""The data plane: a read's record bytes over plain TCP beside the gRPC control plane.

A reader opens a pass with AcquireReadLease(data_plane=True) over gRPC and gets a
ticket bound to that lease and to its address (cacheserver/catalog/leases.py);
its data connections present the ticket, then ask for shard runs and element
lists as ReadShard and ReadElements would (client/wire/plane.py has the framing).
The daemon reads the values in the same short LMDB transactions as ReadShard and
hands the kernel their views into the map with one sendmsg per chunk: no join,
no message, no serialization (docs/design.md "A data plane beside gRPC").

Limits, as on the gRPC side: connections are capped in total (--max-streams) and
per client address (--max-streams-per-client), refused beyond with an ERROR
frame; a hello must arrive within HELLO_TIMEOUT seconds; a connection idle
between requests, or a reader that takes nothing for --stream-idle-timeout
seconds, is closed. Each connection has its own thread, so a paused reader
blocks nobody else. With --tls-cert the port speaks TLS with the same
certificate (and client CA) as gRPC, and refuses plaintext.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from typing import Any

from cacheserver import metrics
from cacheserver.catalog import reads
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.leases import Lease, LeaseTable
from cacheserver.security import TlsMaterial, peer_ip
from client.format.read_ahead import ReadAheads
from client.wire import limits, plane
from client.wire.status import (
    CacheServerError,
    InvalidArgument,
    LeaseNotFound,
    ShuttingDown,
    TooManyStreams,
    Unauthenticated,
)

log = logging.getLogger(__name__)
#: Seconds a new connection has to finish its TLS handshake and send its hello (at most
#: --stream-idle-timeout).
HELLO_TIMEOUT = 10.0


class DataPlane:
    """The data port of one daemon: start(), then stop(grace) with the gRPC drain."""

    def __init__(
        self,
        catalog: Catalog,
        leases: LeaseTable,
        address: str,
        tls: TlsMaterial | None,
        max_connections: int,
        per_client: int,
        idle_timeout: float,
    ) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, int(port)), family=family, backlog=512)
        except OSError as exc:
            raise OSError(
                f"cannot listen on {address} for the data plane: {exc.strerror}; "
                "pass another --data-listen (or off)"
            ) from exc
        self.port: int = self._listener.getsockname()[1]
        self.address = f"{address.rpartition(':')[0]}:{self.port}"
        self._catalog = catalog
        self._leases = leases
        self._tls = tls.server_context() if tls is not None else None
        self._max = max_connections
        self._per_client = per_client
        self._idle = idle_timeout
        self._hello_timeout = min(HELLO_TIMEOUT, idle_timeout)
        self._lock = threading.Condition()
        self._open: dict[socket.socket, bool] = {}  # connection -> serving a request now
        self._by_peer: Counter[str] = Counter()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="data-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float) -> None:
        """Take no new connections or requests; let requests being served finish for up to
        grace seconds, then close every connection."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join()
        deadline = time.monotonic() + grace
        with self._lock:
            while True:
                for conn, busy in self._open.items():
                    if not busy:
                        _shutdown(conn)
                if not any(self._open.values()) or time.monotonic() >= deadline:
                    break
                self._lock.wait(min(0.1, max(deadline - time.monotonic(), 0.0)))
            for conn in self._open:
                _shutdown(conn)
            self._lock.wait_for(lambda: not self._open, timeout=5.0)

    # --------------------------------------------------------------- connections

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, address = self._listener.accept()
            except OSError as exc:
                if self._stopping.is_set():
                    return
                log.warning("data plane: accept failed (%s); retrying", exc)
                time.sleep(0.1)  # out of file descriptors: let connections close
                continue
            peer = peer_ip(address[0])
            with self._lock:
                total, held = len(self._open), self._by_peer[peer]
                full = total >= self._max or held >= self._per_client
                if not full:
                    self._open[conn] = False
                    self._by_peer[peer] += 1
            if full:
                self._refuse_now(
                    conn,
                    TooManyStreams(
                        f"the data plane holds {total} connections ({held} from {peer}); the "
                        f"daemon allows {self._max} (--max-streams), {self._per_client} per client "
                        "(--max-streams-per-client): use fewer connections or raise the limits"
                    ),
                )
                continue
            threading.Thread(
                target=self._serve, args=(conn, peer), name="data-conn", daemon=True
            ).start()

    def _refuse_now(self, conn: socket.socket, exc: CacheServerError) -> None:
        """Refuse a connection without a thread: one non-blocking send, then close."""
        metrics.DATA_REFUSED.labels(exc.reason).inc()
        try:
            if self._tls is None:  # a TLS client could not read it before a handshake
                conn.setblocking(False)
                conn.send(plane.error_frame(exc.code.value[0], exc.reason, str(exc)))
        except OSError:
            pass
        conn.close()

    def _serve(self, conn: Any, peer: str) -> None:
        metrics.DATA_CONNECTIONS.inc()
        raw, aheads = conn, None
        try:
            # each chunk is one sendmsg and each answer ends in a small END frame: sent at
            # once, not held back by Nagle for the reader's delayed ACK (~40 ms a request)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self._hello_timeout)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            with self._lock:
                self._open[conn] = self._open.pop(raw)
            lease = self._hello(conn, peer)
            conn.sendall(plane.FRAME.pack(plane.OK, 0, 0, 0))
            header = bytearray(plane.REQUEST.size)
            aheads = ReadAheads()  # the connection's reads, one chunk a request, share them
            while not self._stopping.is_set():
                conn.settimeout(self._idle)
                first = conn.recv_into(header, 1)
                if not first:
                    return  # the client closed between requests
                plane.recv_exact(conn, memoryview(header)[1:])
                self._set_busy(conn, True)
                try:
                    self._request(conn, lease, plane.REQUEST.unpack(header), aheads)
                finally:
                    self._set_busy(conn, False)
        except CacheServerError as exc:
            self._send_error(conn, exc)
        except plane.FramingError as exc:
            self._send_error(conn, InvalidArgument(f"bad data-plane framing: {exc}"))
        except (OSError, ssl.SSLError) as exc:  # timeouts, resets, a failed handshake
            log.debug("data connection from %s closed: %s", peer, exc)
        except Exception:
            log.exception("data connection from %s failed", peer)
            self._send_error(
                conn, CacheServerError("internal error on the data plane; see the daemon's log")
            )
        finally:
            if aheads is not None:
                aheads.close()
            _close(conn)
            with self._lock:
                self._open.pop(conn, None)
                self._open.pop(raw, None)
                self._by_peer[peer] -= 1
                if not self._by_peer[peer]:
                    del self._by_peer[peer]
                self._lock.notify_all()
            metrics.DATA_CONNECTIONS.dec()

    def _set_busy(self, conn: socket.socket, busy: bool) -> None:
        with self._lock:
            self._open[conn] = busy
            self._lock.notify_all()

    def _send_error(self, conn: socket.socket, exc: CacheServerError) -> None:
        metrics.DATA_REFUSED.labels(exc.reason).inc()
        log.log(
            logging.WARNING if exc.code.name == "DATA_LOSS" else logging.DEBUG,
            "data plane: %s: %s",
            exc.reason,
            exc,
        )
        try:
            conn.settimeout(1.0)
            conn.sendall(plane.error_frame(exc.code.value[0], exc.reason, str(exc)))
        except (OSError, ValueError):
            pass

    def _hello(self, conn: socket.socket, peer: str) -> Lease:
        """The lease whose ticket the hello presents, or a refusal."""
        magic, version, size = plane.HELLO.unpack(plane.recv_bytes(conn, plane.HELLO.size))
        if magic != plane.MAGIC:
            raise InvalidArgument(
                "this is shardcache's data port: it takes a data-plane hello "
                "(client/wire/plane.py), not whatever was sent; gRPC goes "
                "to the daemon's --listen port"
            )
        if version != plane.VERSION:
            raise InvalidArgument(
                f"data-plane version {version} is not served here (version "
                f"{plane.VERSION}): upgrade the client or the daemon"
            )
        if not 0 < size <= limits.MAX_TICKET:
            raise InvalidArgument(
                f"a ticket of {size} bytes; tickets are 1-{limits.MAX_TICKET} bytes"
            )
        lease = self._leases.by_ticket(plane.recv_bytes(conn, size))
        if lease is None:
            raise LeaseNotFound(
                "unknown or expired data-plane ticket (its read lease ended, "
                "or the daemon restarted): take a new lease"
            )
        if lease.peer != peer:
            raise Unauthenticated(
                f"this data-plane ticket was issued to {lease.peer}, not to "
                f"{peer}; each reader asks for its own"
            )
        return lease

    def _request(
        self,
        conn: socket.socket,
        lease: Lease,
        request: tuple[int, int, int, int, int, int],
        aheads: ReadAheads,
    ) -> None:
        kind, flags, n, start, count, chunk_bytes = request
        if not self._leases.alive(lease):
            raise LeaseNotFound(
                f"the read lease on cache {lease.name!r} this ticket belongs to "
                "ended; take a new lease"
            )
        if self._stopping.is_set():
            raise ShuttingDown("the daemon is shutting down; retry against its replacement")
        if kind not in (plane.SHARD, plane.ELEMENTS):
            raise InvalidArgument(
                f"unknown data-plane request kind {kind}: 1 (a shard run) or 2 (element indices)"
            )
        with reads.reading(self._catalog, lease.name, hit=bool(flags & plane.EPOCH_START)):
            self._send(conn, lease, kind, n, start, count, chunk_bytes, aheads)
        conn.sendall(plane.FRAME.pack(plane.END, 0, 0, 0))

    def _send(
        self,
        conn: socket.socket,
        lease: Lease,
        kind: int,
        n: int,
        start: int,
        count: int,
        chunk_bytes: int,
        aheads: ReadAheads,
    ) -> None:
        if kind == plane.SHARD:
            chunks = reads.read_shard(
                self._catalog,
                lease.name,
                n,
                start,
                chunk_bytes,
                lease.fingerprint,
                count,
                join=_Sender(conn),
                aheads=aheads,
            )
            for _first, _lengths, _sent, elements in chunks:
                metrics.READ_ELEMENTS.inc(elements)
        elif kind == plane.ELEMENTS:
            limits.check_indices(n)  # before receiving them
            indices = plane.recv_bytes(conn, 8 * n)
            send = _Sender(conn)
            for position, lengths, data in reads.read_elements(
                self._catalog, lease.name, lease.fingerprint, indices, chunk_bytes
            ):
                send(position, lengths, [data])
                metrics.READ_ELEMENTS.inc(len(lengths) // 4)


class _Sender:
    """ReaderPool.read_chunks' join: sends a chunk from the values' views while they are
    valid, and returns what it sent, in bytes."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._bytes = metrics.READ_BYTES.labels("data")

    def __call__(self, first: int, lengths: bytes, values: list[Any]) -> int:
        size = sum(len(v) for v in values)
        head = plane.FRAME.pack(plane.CHUNK, len(lengths) // 4, first, size)
        plane.send_parts(self._conn, [head, lengths, *values])
        self._bytes.inc(size)
        return size


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()


__all__ = ["HELLO_TIMEOUT", "DataPlane"]
