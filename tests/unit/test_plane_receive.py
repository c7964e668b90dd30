"""client/wire/plane.py's scatter receive: a frame's bytes straight into many buffers."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import trustme

from client.wire import plane


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(10)
    with a, b:
        yield a, b


def parts_of(sizes: list[int]) -> tuple[np.ndarray, list[memoryview]]:
    """One array, cut into buffers of sizes (in order)."""
    out = np.zeros(sum(sizes), np.uint8)
    ends = np.cumsum(sizes)
    return out, [out[e - s : e].data for s, e in zip(sizes, ends)]


def sent_in_pieces(sock: socket.socket, data: bytes, piece: int) -> threading.Thread:
    def send() -> None:
        for at in range(0, len(data), piece):
            sock.sendall(data[at : at + piece])

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_bytes_sent_in_any_pieces_fill_the_buffers_in_order(pair) -> None:
    reader, writer = pair
    rng = np.random.default_rng(0)
    sizes = [5, 0, 16_400, 8, 5, 16_400, 8] * 100  # more buffers than one call takes
    data = rng.integers(0, 256, sum(sizes), np.uint8).tobytes()
    out, parts = parts_of(sizes)
    sender = sent_in_pieces(writer, data + b"next", 7_777)  # cuts across every boundary
    plane.recv_parts(reader, parts)
    sender.join()
    assert out.tobytes() == data
    assert plane.recv_bytes(reader, 4) == b"next"  # nothing of what follows was taken


def test_a_peer_that_closes_in_the_middle_is_a_framing_error(pair) -> None:
    reader, writer = pair
    _, parts = parts_of([5, 1000, 5, 1000])
    writer.sendall(bytes(1500))
    writer.close()
    with pytest.raises(plane.FramingError, match="connection closed after 1500 of 2010 bytes"):
        plane.recv_parts(reader, parts)


def test_over_tls_the_buffers_are_filled_one_by_one(pair) -> None:
    reader, writer = pair
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    sizes = [5, 20_000, 8] * 4
    data = np.random.default_rng(1).integers(0, 256, sum(sizes), np.uint8).tobytes()

    def serve() -> None:
        with server.wrap_socket(writer, server_side=True) as tls:
            tls.sendall(data)
            tls.recv(1)  # until the reader is done

    sender = threading.Thread(target=serve)
    sender.start()
    with client.wrap_socket(reader, server_hostname="localhost") as tls:
        out, parts = parts_of(sizes)
        plane.recv_parts(tls, parts)
        tls.sendall(b"x")
    sender.join()
    assert out.tobytes() == data
