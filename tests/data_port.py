"""The data plane spoken by hand, for tests: tickets over gRPC, frames over a raw socket."""

from __future__ import annotations

import socket
import struct

import grpc
from wire import stub

from client.wire import plane
from client.wire.v1 import cache_service_pb2 as pb


def lease(channel: grpc.Channel, name: str) -> pb.AcquireReadLeaseResponse:
    """A read lease on name with a data-plane ticket (empty when the caller gets none)."""
    return stub(channel).AcquireReadLease(
        pb.AcquireReadLeaseRequest(name=name, data_plane=True), timeout=10
    )


def release(channel: grpc.Channel, granted: pb.AcquireReadLeaseResponse) -> None:
    stub(channel).ReleaseReadLease(
        pb.ReleaseReadLeaseRequest(lease_id=granted.lease_id), timeout=10
    )


def connect(port: int, source: str = "127.0.0.1", host: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    return sock


def frame(sock: socket.socket) -> tuple[int, int, int, bytes]:
    """The next frame: (kind, n, first, its payload: an ERROR's text, a CHUNK's lengths and
    data); raises EOFError when the daemon closed the connection first."""
    header = _exactly(sock, plane.FRAME.size)
    kind, n, first, size = plane.FRAME.unpack(header)
    if kind == plane.ERROR:
        return kind, n, first, _exactly(sock, n)
    if kind == plane.CHUNK:
        return kind, n, first, _exactly(sock, 4 * n + size)
    return kind, n, first, b""


def error(sock: socket.socket) -> tuple[str, str]:
    """(reason, message) of the ERROR frame the daemon sends next."""
    kind, _, _, text = frame(sock)
    assert kind == plane.ERROR, f"frame kind {kind}, not an ERROR"
    return plane.parse_error(text)


def hello(sock: socket.socket, ticket: bytes) -> None:
    sock.sendall(plane.hello(ticket))


def opened(port: int, ticket: bytes, source: str = "127.0.0.1") -> socket.socket:
    """A connection whose hello the daemon accepted."""
    sock = connect(port, source)
    hello(sock, ticket)
    kind, _, _, text = frame(sock)
    assert kind == plane.OK, plane.parse_error(text)
    return sock


def shard_values(
    sock: socket.socket, shard: int, start: int, count: int, chunk_bytes: int = 1 << 20
) -> list[bytes]:
    """The stored values of a shard run, asked for on an open connection."""
    sock.sendall(plane.REQUEST.pack(plane.SHARD, 0, shard, start, count, chunk_bytes))
    values: list[bytes] = []
    while True:
        kind, n, _, payload = frame(sock)
        if kind == plane.END:
            return values
        assert kind == plane.CHUNK, plane.parse_error(payload)
        lengths = struct.unpack(f"<{n}I", payload[: 4 * n])
        offset = 4 * n
        for length in lengths:
            values.append(payload[offset : offset + length])
            offset += length


def closed_by_daemon(sock: socket.socket, timeout: float) -> bool:
    """True when the daemon closes the connection (EOF or reset) within timeout seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        got = sock.recv(size - len(buf))
        if not got:
            raise EOFError(
                f"the daemon closed the connection after {len(buf)} of {size} bytes of a frame"
            )
        buf += got
    return bytes(buf)
