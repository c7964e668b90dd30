"""The data plane: remote reads over the data port, its tickets, TLS and the fallback to gRPC."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import grpc
import pytest
from daemon import Daemon, free_port
from data_port import (
    closed_by_daemon,
    connect,
    error,
    frame,
    hello,
    lease,
    opened,
    release,
    shard_values,
)
from exposition import scrape
from pki import Pki
from waits import wait_until
from wire import records, write_cache

from client.wire import plane
from client.wire.v1 import cache_service_pb2 as pb

tf = pytest.importorskip("tensorflow")

from client import CacheClient  # noqa: E402

N = 2000


def source() -> tf.data.Dataset:
    return tf.data.Dataset.range(N).map(lambda i: (i, tf.fill([256], tf.cast(i, tf.float32))))


def metered(*args: str) -> Daemon:
    port = free_port()
    d = Daemon(extra_args=("--metrics-listen", f"127.0.0.1:{port}", *args))
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    return d.start()


def read_bytes(d: Daemon) -> dict[str, float]:
    samples = scrape(d.metrics_url)  # type: ignore[attr-defined]
    counts = {
        plane_: samples[("shardcache_read_bytes_total", (("plane", plane_),))]
        for plane_ in ("grpc", "data")
    }
    counts["elements"] = samples[("shardcache_read_elements_total", ())]
    return counts


@pytest.fixture
def plane_daemon() -> Iterator[Daemon]:
    d = metered("--lease-ttl", "1")
    yield d
    d.close()


def test_remote_reads_go_over_the_data_plane_and_yield_every_element(plane_daemon) -> None:
    with CacheClient(plane_daemon.tcp_target) as cc:
        assert [int(i) for i, _ in cc.cache(source(), name="p")] == list(range(N))
        before = read_bytes(plane_daemon)
        ordered = [(int(i), float(x[0])) for i, x in cc.dataset("p", direct=False)]
        shuffled = [int(i) for i, _ in cc.dataset("p", direct=False, shuffle=True, seed=7)]
        share = [int(i) for i, _ in cc.dataset("p", direct=False, num_workers=3, worker_index=1)]
        after = read_bytes(plane_daemon)
    assert ordered == [(i, float(i)) for i in range(N)]
    assert sorted(shuffled) == list(range(N)) and shuffled != list(range(N))
    assert share and set(share) < set(range(N))
    assert after["grpc"] == before["grpc"], "remote reads went over gRPC"
    assert after["data"] > before["data"]
    assert after["elements"] - before["elements"] == 2 * N + len(share)


def test_tickets_are_bound_to_their_lease_and_caller_and_die_with_the_lease(plane_daemon) -> None:
    data = records(40, 10_000)
    with grpc.insecure_channel(plane_daemon.tcp_target) as ch, contextlib.ExitStack() as socks:
        write_cache(ch, "t", data)
        granted = lease(ch, "t")
        assert granted.ticket and granted.data_port
        sock = socks.enter_context(opened(granted.data_port, granted.ticket))
        assert shard_values(sock, 0, 0, 40) == data
        assert shard_values(sock, 0, 10, 5) == data[10:15]

        forged = socks.enter_context(connect(granted.data_port))
        hello(forged, os.urandom(32))
        assert error(forged)[0] == "LEASE_NOT_FOUND"
        elsewhere = socks.enter_context(connect(granted.data_port, source="127.0.0.2"))
        hello(elsewhere, granted.ticket)
        reason, message = error(elsewhere)
        assert reason == "UNAUTHENTICATED" and "issued to 127.0.0.1" in message

        release(ch, granted)  # the open connection's next request, and any replay, refused
        sock.sendall(plane.REQUEST.pack(plane.SHARD, 0, 0, 0, 1, 1 << 20))
        assert error(sock)[0] == "LEASE_NOT_FOUND"
        assert _refused(granted)

        lapsed = lease(ch, "t")  # never renewed: it expires after --lease-ttl 1
        wait_until(lambda: _refused(lapsed), 10, "the expired lease's ticket refused")
    with grpc.insecure_channel(plane_daemon.unix_target) as local:
        assert not lease(local, "t").ticket, "a unix-socket caller reads its files or gRPC"
    assert "Traceback" not in plane_daemon.log()


def _refused(granted) -> bool:
    with connect(granted.data_port) as sock:
        hello(sock, granted.ticket)
        kind, _, _, text = frame(sock)
    return kind == plane.ERROR and plane.parse_error(text)[0] == "LEASE_NOT_FOUND"


def test_a_paused_reader_blocks_no_other_reader(plane_daemon) -> None:
    data = records(64, 1 << 20)  # 64 MiB: far more than the socket buffers hold
    with grpc.insecure_channel(plane_daemon.tcp_target) as ch:
        write_cache(ch, "big", data)
        granted, other = lease(ch, "big"), lease(ch, "big")
        with (
            opened(granted.data_port, granted.ticket) as paused,
            opened(other.data_port, other.ticket) as sock,
        ):
            paused.sendall(plane.REQUEST.pack(plane.SHARD, 0, 0, 0, 64, 4 << 20))  # never read
            assert shard_values(sock, 0, 0, 64, 4 << 20) == data


def test_a_data_port_the_client_cannot_reach_leaves_reads_on_grpc_said_once_and_counted(
    caplog,
) -> None:
    """The daemon listens for data on 127.0.0.2: from 127.0.0.1 the port refuses, as a
    firewall passing only gRPC's port would."""
    d = metered("--data-listen", "127.0.0.2:0")
    try:
        with CacheClient(d.tcp_target) as cc, caplog.at_level(logging.WARNING, "client"):
            list(cc.cache(source(), name="f"))
            passes = [[int(i) for i, _ in cc.dataset("f", direct=False)] for _ in range(2)]
        assert passes == [list(range(N))] * 2
        said = [r for r in caplog.records if "cannot reach the data port" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]
        samples = scrape(d.metrics_url)  # type: ignore[attr-defined]
        assert samples[("shardcache_data_fallbacks_total", ())] >= 1
        assert read_bytes(d)["data"] == 0 and read_bytes(d)["grpc"] > 0
        assert "do not get through" in d.log()
    finally:
        d.close()


def test_with_tls_the_data_plane_is_tls_and_refuses_plaintext(tmp_path) -> None:
    pki = Pki(tmp_path)
    d = metered("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    try:
        with CacheClient(d.tcp_target, tls_ca=pki.ca_pem) as cc:
            list(cc.cache(source(), name="s"))
            before = read_bytes(d)
            assert [int(i) for i, _ in cc.dataset("s", direct=False)] == list(range(N))
            assert read_bytes(d)["data"] > before["data"]
            granted = cc._transport.stub.AcquireReadLease(
                pb.AcquireReadLeaseRequest(name="s", data_plane=True)
            )
        with connect(granted.data_port) as plain:
            hello(plain, granted.ticket)  # not a TLS ClientHello: the handshake fails
            assert closed_by_daemon(plain, 15)
    finally:
        d.close()
    assert "Traceback" not in d.log()


def test_readers_beyond_the_hosts_connection_limit_read_their_chunks_over_grpc() -> None:
    """Two passes at once, 2 chunks in flight each, against 3 data connections per client
    host (and 3 gRPC streams, counted apart): the chunks whose connection is refused go
    over gRPC instead."""
    d = metered("--max-streams-per-client", "3")
    try:
        noise = tf.data.Dataset.range(N).map(
            lambda i: (i, tf.random.stateless_uniform([1024], seed=tf.stack([i, 0])))
        )
        with CacheClient(d.tcp_target) as cc:
            list(cc.cache(noise, name="c"))  # 8 MB: chunks of 128 KiB
            options = {"direct": False, "parallel_shards": 2, "prefetch_bytes": 1 << 20}
            first, second = (cc.dataset("c", **options).as_numpy_iterator() for _ in range(2))
            got = [[], []]
            for a, b in zip(first, second):
                got[0].append(int(a[0]))
                got[1].append(int(b[0]))
        assert got == [list(range(N))] * 2
        counts = read_bytes(d)
        assert counts["data"] > 0 and counts["grpc"] > 0, counts
    finally:
        d.close()
