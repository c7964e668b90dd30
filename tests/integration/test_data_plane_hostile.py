"""The data port under hostile input: garbage, slow and idle connections, floods, fuzzed
frames, SIGTERM mid-transfer. Every refusal is an ERROR frame or a close; the daemon keeps
its threads and memory bounded, logs no traceback and serves the next reader."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import grpc
import psutil
import pytest
from daemon import Daemon
from data_port import closed_by_daemon, connect, error, frame, hello, lease, opened, shard_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waits import wait_until
from wire import records, write_cache

from client.wire import plane

PER_CLIENT = 4
DATA = records(32, 8192, 3)


@pytest.fixture(scope="module")
def port_daemon() -> Iterator[tuple[Daemon, grpc.Channel]]:
    d = Daemon(
        extra_args=("--stream-idle-timeout", "1", "--max-streams-per-client", str(PER_CLIENT))
    ).start()
    with grpc.insecure_channel(d.tcp_target) as channel:
        write_cache(channel, "h", DATA)
        yield d, channel
        granted = lease(channel, "h")  # still serving, unchanged
        with opened(granted.data_port, granted.ticket) as sock:
            assert shard_values(sock, 0, 0, len(DATA)) == DATA
    log = d.log()
    d.close()
    assert "Traceback" not in log, log[-4000:]


def _process(d: Daemon) -> psutil.Process:
    assert d.proc is not None
    return psutil.Process(d.proc.pid)


def test_garbage_slow_and_silent_connections_get_a_clear_refusal_or_are_closed(port_daemon) -> None:
    _, channel = port_daemon
    granted = lease(channel, "h")
    with connect(granted.data_port) as http:
        http.sendall(b"GET /data HTTP/1.1\r\nHost: x\r\n\r\n")
        reason, message = error(http)
        assert reason == "INVALID_ARGUMENT" and "data port" in message
    with connect(granted.data_port) as big:
        big.sendall(plane.HELLO.pack(plane.MAGIC, plane.VERSION, 200))
        assert "tickets are 1-64 bytes" in error(big)[1]
    with connect(granted.data_port) as slow:  # slowloris: half a hello, then nothing
        slow.sendall(plane.MAGIC[:2])
        assert closed_by_daemon(slow, 10)
    with opened(granted.data_port, granted.ticket) as silent:  # a hello, then nothing
        assert closed_by_daemon(silent, 10)
    with opened(granted.data_port, granted.ticket) as sock:
        sock.sendall(plane.REQUEST.pack(9, 0, 0, 0, 0, 0))
        assert "unknown data-plane request kind 9" in error(sock)[1]
    with opened(granted.data_port, granted.ticket) as sock:
        sock.sendall(plane.REQUEST.pack(plane.SHARD, 0, 7, 0, 1, 0))
        assert error(sock) == ("INVALID_ARGUMENT", "cache 'h' has 1 shards; shard 7 does not exist")
    with opened(granted.data_port, granted.ticket) as sock:
        sock.sendall(plane.REQUEST.pack(plane.ELEMENTS, 0, 1 << 30, 0, 0, 0))
        assert "the limit is 65536" in error(sock)[1]


def test_a_flood_of_connections_is_refused_with_bounded_threads_and_memory(port_daemon) -> None:
    d, channel = port_daemon
    granted = lease(channel, "h")
    process = _process(d)
    threads, rss = process.num_threads(), process.memory_info().rss
    with contextlib.ExitStack() as held:
        for _ in range(PER_CLIENT):
            held.enter_context(opened(granted.data_port, granted.ticket))
        with connect(granted.data_port) as beyond:  # one more from this host: refused
            reason, message = error(beyond)
        assert reason == "TOO_MANY_STREAMS" and "--max-streams-per-client" in message
        peak = process.num_threads()
        for _ in range(10_000):  # each refused at once, without a thread
            with contextlib.suppress(OSError), connect(granted.data_port) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            peak = max(peak, process.num_threads()) if _ % 500 == 0 else peak
    # the held connections' threads end once the daemon reads their close
    wait_until(lambda: process.num_threads() <= threads, what="the held connections to end")
    with opened(granted.data_port, granted.ticket) as sock:  # and the next reader is served
        assert shard_values(sock, 0, 0, 3) == DATA[:3]
    assert peak <= threads + PER_CLIENT + 2, (threads, peak)
    grown = process.memory_info().rss - rss
    assert grown < 32 << 20, f"RSS grew by {grown >> 20} MiB for 10,000 connections"


def test_fuzzed_hellos_and_requests_get_an_error_frame_or_a_close(port_daemon) -> None:
    d, channel = port_daemon
    granted = lease(channel, "h")
    rss = _process(d).memory_info().rss

    @settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        ticketed=st.booleans(),
        blob=st.one_of(
            st.binary(max_size=96),
            st.builds(
                lambda kind, flags, n, a, b, c, tail: (
                    plane.REQUEST.pack(kind, flags, n, a, b, c) + tail
                ),
                st.integers(0, 255),
                st.integers(0, 255),
                st.integers(0, 2**32 - 1),
                st.integers(0, 2**64 - 1),
                st.integers(0, 2**64 - 1),
                st.integers(0, 2**64 - 1),
                st.binary(max_size=64),
            ),
        ),
    )
    def probe(ticketed: bool, blob: bytes) -> None:
        with connect(granted.data_port) as sock:
            if ticketed:
                hello(sock, granted.ticket)
                assert frame(sock)[0] == plane.OK
            with contextlib.suppress(OSError):  # the daemon may have answered and closed
                sock.sendall(blob)
                sock.shutdown(socket.SHUT_WR)  # a frame cut short ends at the daemon's EOF
            sock.settimeout(10)
            with contextlib.suppress(EOFError, ConnectionResetError):
                while True:  # data, then an END or an ERROR frame, then the close
                    kind = frame(sock)[0]
                    assert kind in (plane.CHUNK, plane.END, plane.ERROR)
                    if kind == plane.ERROR:
                        break

    probe()
    grown = _process(d).memory_info().rss - rss
    assert grown < 32 << 20, f"RSS grew by {grown >> 20} MiB"


def test_sigterm_lets_a_data_plane_transfer_finish_then_refuses() -> None:
    d = Daemon().start()
    try:
        data = records(64, 1 << 20)
        with grpc.insecure_channel(d.tcp_target) as channel:
            write_cache(channel, "drained", data)
            granted = lease(channel, "drained")
        with opened(granted.data_port, granted.ticket) as sock:
            sock.sendall(plane.REQUEST.pack(plane.SHARD, 0, 0, 0, 64, 1 << 20))
            kind, n, _, payload = frame(sock)
            assert kind == plane.CHUNK
            code: dict[str, int] = {}
            waiter = threading.Thread(target=lambda: code.setdefault("rc", d.terminate()))
            waiter.start()
            got = len(payload) - 4 * n
            while (part := frame(sock))[0] == plane.CHUNK:
                got += len(part[3]) - 4 * part[1]
            assert part[0] == plane.END and got == 64 << 20
            assert closed_by_daemon(sock, 30)  # no request after the drain
            waiter.join(60)
        assert code["rc"] == 0
        with pytest.raises(OSError):
            connect(granted.data_port).close()
    finally:
        d.close()
