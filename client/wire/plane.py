"""The data plane's framing: what a data connection carries, shared by daemon and client.

A data connection is plain TCP (TLS when the daemon serves gRPC over TLS) to the
daemon's data port. Every integer is little-endian.

* The client opens with a hello: ``MAGIC``, a version byte, the ticket's length
  (one byte) and the ticket AcquireReadLease returned. The daemon answers with an
  OK frame, or an ERROR frame and closes.
* Then requests, one at a time, each a :data:`REQUEST` header: kind, flags, u32 n,
  three u64 fields. ``SHARD``: records [start, start + count) of shard n in chunks of
  about chunk_bytes (ReadShardRequest's fields). ``ELEMENTS``: n global indices follow
  as u64s; the records in request order (ReadElementsRequest's). Flag ``EPOCH_START``:
  the request starts a reader's pass (the daemon counts a hit, as epoch_start does).
* The daemon answers a request with CHUNK frames and one END frame. A CHUNK's header
  is followed by n u32 lengths and then the data (the values, ``size`` bytes): the
  fields of a ReadShardResponse (``first`` is its start) or ReadElementsResponse
  (``first`` is its position).
* An ERROR frame carries the gRPC status code in ``first``, then n bytes of UTF-8:
  the reason (client/wire/status.py), a newline and the message. The daemon closes
  the connection after it.
"""

from __future__ import annotations

import socket
import ssl
import struct
import tempfile
from collections.abc import Sequence

from client.wire.limits import MAX_ERROR_TEXT

MAGIC = b"SCDP"
VERSION = 1
HELLO = struct.Struct("<4sBB")  # magic, version, ticket length; the ticket follows
REQUEST = struct.Struct("<BB2xIQQQ")  # kind, flags, n, start, count, chunk_bytes
SHARD, ELEMENTS = 1, 2
EPOCH_START = 1
FRAME = struct.Struct("<B3xIQQ")  # kind, n, first, size
CHUNK, END, ERROR, OK = 1, 2, 3, 4
#: Most buffers one sendmsg or recvmsg_into call takes (Linux's IOV_MAX is 1024).
_IOV = 512


class FramingError(Exception):
    """The peer sent bytes that are not this protocol (or closed in the middle of a frame)."""


def load_cert_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """Load a PEM certificate chain and its key, held in memory, into context (the daemon's
    --tls-cert/--tls-key, a client's tls_cert/tls_key): ssl reads them only from files, so
    they pass through two private temporary files, deleted at once."""
    with tempfile.NamedTemporaryFile() as chain_file, tempfile.NamedTemporaryFile() as key_file:
        chain_file.write(chain)
        key_file.write(key)
        chain_file.flush()
        key_file.flush()
        context.load_cert_chain(chain_file.name, key_file.name)


def hello(ticket: bytes) -> bytes:
    return HELLO.pack(MAGIC, VERSION, len(ticket)) + ticket


def error_frame(code: int, reason: str, message: str) -> bytes:
    text = f"{reason}\n{message}".encode()[:MAX_ERROR_TEXT]
    return FRAME.pack(ERROR, len(text), code, 0) + text


def parse_error(text: bytes) -> tuple[str, str]:
    """(reason, message) of an ERROR frame's text."""
    reason, _, message = text.decode("utf-8", "replace").partition("\n")
    return reason, message


def recv_exact(sock: socket.socket, out: memoryview) -> None:
    """Fill out from sock; FramingError when the peer closes first."""
    got, size = 0, len(out)
    while got < size:
        n = sock.recv_into(out[got:], size - got)
        if not n:
            raise FramingError(f"connection closed after {got} of {size} bytes of a frame")
        got += n


def recv_parts(sock: socket.socket, parts: Sequence[memoryview]) -> None:
    """Fill every part, in order, from sock: recvmsg_into scatters the stream's next bytes
    across up to 512 parts a call, so they land where they belong without a copy of the
    reader's own; a TLS socket, which has no recvmsg_into, fills them one by one.
    FramingError when the peer closes first."""
    if isinstance(sock, ssl.SSLSocket):
        for part in parts:
            recv_exact(sock, part)
        return
    pending = [part for part in parts if len(part)]
    at, size, got = 0, sum(len(part) for part in pending), 0
    while at < len(pending):
        n = sock.recvmsg_into(pending[at : at + _IOV])[0]
        if not n:
            raise FramingError(f"connection closed after {got} of {size} bytes of a frame")
        got += n
        while at < len(pending) and n >= len(pending[at]):
            n -= len(pending[at])
            at += 1
        if n:
            pending[at] = pending[at][n:]


def recv_bytes(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    recv_exact(sock, memoryview(buf))
    return bytes(buf)


def send_parts(sock: socket.socket, parts: Sequence[bytes | memoryview]) -> int:
    """Send every part, in order, without joining them: one sendmsg for up to 512 parts
    (the values stay in LMDB's map until the kernel copies them); a TLS socket, which has
    no sendmsg, sends them one by one. Returns the bytes sent."""
    total = 0
    if isinstance(sock, ssl.SSLSocket):
        for part in parts:
            sock.sendall(part)
            total += len(part)
        return total
    pending = [memoryview(p).cast("B") for p in parts if len(p)]
    while pending:
        sent = sock.sendmsg(pending[:_IOV])
        total += sent
        while pending and sent >= len(pending[0]):
            sent -= len(pending[0])
            pending.pop(0)
        if sent:
            pending[0] = pending[0][sent:]
    return total
