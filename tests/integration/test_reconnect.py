"""Reconnect: a daemon lost mid-epoch (kill -9, restart on the same socket) loses nothing,
over gRPC (the unix socket) and over the data plane (TCP: client/read/fetching/plane.py)."""

from __future__ import annotations

import logging
import threading

import pytest

tf = pytest.importorskip("tensorflow")

from daemon import Daemon  # noqa: E402
from sharded import write_sharded  # noqa: E402
from waits import LostDaemon  # noqa: E402

from client import CacheClient  # noqa: E402

N = 3000  # ~4 KiB elements: 12 MB, far more than the client buffers with 64 KiB prefetch
SMALL_PREFETCH = 64 << 10


def source(n: int = N, offset: int = 0, width: int = 1024) -> tf.data.Dataset:
    """Element i: (i + offset, then width - 1 random floats: incompressible), i."""

    def element(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        noise = tf.random.stateless_uniform([width - 1], seed=tf.stack([i, 0]))
        return tf.concat([[tf.cast(i + offset, tf.float32)], noise], 0), i

    return tf.data.Dataset.range(n).map(element)


def check(element: tuple) -> int:
    x, i = element
    assert x[0] == i  # the record is element i of the original cache
    return int(i)


#: How a test reaches its daemon: gRPC alone (unix socket), or the data plane (TCP).
VIA = pytest.mark.parametrize("via", ["grpc", "plane"])


def target(daemon: Daemon, via: str) -> str:
    return daemon.unix_target if via == "grpc" else daemon.tcp_target


@VIA
@pytest.mark.parametrize("parallel", [1, 3])
def test_a_daemon_restarted_mid_epoch_yields_every_element_once_in_the_same_order(
    fresh_daemon, parallel, via
) -> None:
    with CacheClient(target(fresh_daemon, via)) as cc:
        write_sharded(cc, source(), "big", shard_bytes=1 << 20, chunk_bytes=256 << 10)
        options = {
            "shuffle": True,
            "seed": 3,
            "parallel_shards": parallel,
            "prefetch_bytes": SMALL_PREFETCH,
            "direct": False,
        }  # gRPC's reconnect
        expected = [check(e) for e in cc.dataset("big", **options).as_numpy_iterator()]
        it = cc.dataset("big", **options).as_numpy_iterator()
        got = [check(next(it)) for _ in range(500)]
        watcher = LostDaemon()
        logging.getLogger("client").addHandler(watcher)
        errors: list[BaseException] = []

        def consume() -> None:
            try:
                got.extend(check(e) for e in it)
            except BaseException as exc:
                errors.append(exc)

        consumer = threading.Thread(target=consume)
        try:
            fresh_daemon.kill()  # kill -9 in the middle of the epoch
            consumer.start()
            assert watcher.lost.wait(60), "the client never noticed the daemon was gone"
            fresh_daemon.start()  # a new process on the same socket and data dir
            consumer.join(120)
        finally:
            logging.getLogger("client").removeHandler(watcher)
    assert not consumer.is_alive() and not errors, errors
    assert len(got) == N
    assert got == expected


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_daemon_restarted_mid_epoch_of_batches_received_into_their_rows_loses_nothing(
    fresh_daemon, shuffle
) -> None:
    """Records of 16 KiB and more, stored raw, are received by the data plane into the
    batch's rows (client/read/assembly/landing.py): a connection lost in the middle of one
    is asked again, and the rows written over."""
    n, size = 3200, 128  # 52 MB of 16 KiB records; batches of 2 MiB, one a request (reads.py)
    with CacheClient(fresh_daemon.tcp_target) as cc:
        write_sharded(cc, source(n, width=4100), "large", shard_bytes=2 << 20)
        options = {"shuffle": shuffle, "seed": 3, "direct": False}
        expected = [
            [check(e) for e in zip(*batch)]
            for batch in cc.dataset("large", **options).batch(size).as_numpy_iterator()
        ]
        it = cc.dataset("large", **options).batch(size).as_numpy_iterator()
        got = [[check(e) for e in zip(*next(it))] for _ in range(3)]
        watcher = LostDaemon()
        logging.getLogger("client").addHandler(watcher)
        try:
            fresh_daemon.kill()
            assert watcher.lost.wait(60), "the client never noticed the daemon was gone"
            fresh_daemon.start()
            got.extend([check(e) for e in zip(*batch)] for batch in it)
        finally:
            logging.getLogger("client").removeHandler(watcher)
    assert got == expected
    assert len(got) == n // size


@VIA
def test_a_daemon_that_stays_down_ends_the_read_with_a_clear_error(
    fresh_daemon, no_thread_leak, via
) -> None:
    with CacheClient(target(fresh_daemon, via)) as cc:
        write_sharded(cc, source(), "big", shard_bytes=1 << 20, chunk_bytes=256 << 10)
        ds = cc.dataset(
            "big", prefetch_bytes=SMALL_PREFETCH, reconnect_timeout=1, direct=False
        )  # a direct pass needs no daemon once leased
        it = ds.as_numpy_iterator()
        for _ in range(100):
            next(it)
        fresh_daemon.kill()
        with pytest.raises(
            Exception,
            match=r"ReconnectTimeoutError.*could not reconnect "
            r"within reconnect_timeout=1s",
        ) as info:
            for _ in it:
                pass
    assert isinstance(info.value, tf.errors.OpError)  # TF wraps what the generator raised


@VIA
def test_a_cache_replaced_while_the_daemon_was_down_is_an_error_not_mixed_data(
    fresh_daemon, no_thread_leak, via
) -> None:
    other = Daemon().start()  # a data dir holding another "big": same name, other fingerprint
    try:
        with CacheClient(other.unix_target) as cc:
            write_sharded(cc, source(offset=10**6), "big", shard_bytes=1 << 20, version="v2")
        other.kill()
        with CacheClient(target(fresh_daemon, via)) as cc:
            write_sharded(cc, source(), "big", shard_bytes=1 << 20)
            it = cc.dataset("big", prefetch_bytes=SMALL_PREFETCH, direct=False).as_numpy_iterator()
            got = [check(next(it)) for _ in range(100)]
            fresh_daemon.kill()
            fresh_daemon.data_dir = other.data_dir
            fresh_daemon.start()
            with pytest.raises(Exception, match=r"FingerprintMismatchError.*was replaced"):
                for element in it:
                    got.append(check(element))
        assert got == list(range(len(got)))  # nothing of the replacement was yielded
    finally:
        other.close()


@VIA
def test_a_pass_that_starts_while_the_daemon_is_down_waits_for_it(fresh_daemon, via) -> None:
    with CacheClient(target(fresh_daemon, via)) as cc:
        write_sharded(cc, source(), "big", shard_bytes=1 << 20)
        ds = cc.dataset("big", prefetch_bytes=SMALL_PREFETCH, direct=False)
        assert [check(e) for e in ds.as_numpy_iterator()] == list(range(N))
        fresh_daemon.kill()
        back = threading.Timer(1.0, fresh_daemon.start)
        back.start()
        try:
            assert [check(e) for e in ds.as_numpy_iterator()] == list(range(N))
        finally:
            back.join()
