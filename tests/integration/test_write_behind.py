"""Write-behind (client/write/write_behind.py): failures, errors and stops around its thread."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from client import CacheClient, CacheNotFoundError  # noqa: E402
from client._transport import Transport, pb  # noqa: E402
from client.format.codec import RecordError  # noqa: E402
from client.format.layout import Layout, Leaf  # noqa: E402
from client.write.stream import CacheWriter  # noqa: E402
from client.write.write_behind import WriteBehind  # noqa: E402


def _big_elements(n: int) -> tf.data.Dataset:
    """n elements of 256 KiB each (several write chunks), label i."""
    return tf.data.Dataset.range(n).map(lambda i: (tf.fill([64 << 10], tf.cast(i, tf.float32)), i))


def test_a_daemon_killed_mid_first_epoch_leaves_training_running_from_the_source(
    fresh_daemon, caplog, no_thread_leak
) -> None:
    with CacheClient(fresh_daemon.unix_target) as cc:
        ds = cc.cache(_big_elements(120), name="killed")
        seen = []
        with caplog.at_level(logging.WARNING, logger="client"):
            for features, label in ds:
                seen.append(int(label))
                assert float(features[0]) == int(label)
                if len(seen) == 20:
                    fresh_daemon.kill()  # kill -9, with chunks in flight
        assert seen == list(range(120)), "the epoch must go on from the source, in order"
        assert "stopped writing cache" in caplog.text, caplog.text
        fresh_daemon.start()  # same data directory: the uncommitted write left nothing
        with pytest.raises(CacheNotFoundError):
            cc.info("killed")


def _begun_writer(
    target: str, name: str, layout: Layout, spec: bytes = b""
) -> tuple[Transport, CacheWriter]:
    transport = Transport(target)
    writer = CacheWriter(
        transport,
        pb.WriteBegin(name=name, fingerprint="f", layout_json=layout.to_json(), element_spec=spec),
    )
    assert writer.begin().decision == pb.WRITE_DECISION_ACCEPTED
    return transport, writer


def test_an_element_the_codec_refuses_reaches_the_epoch_and_the_write_is_discarded(
    daemon, cc, name, no_thread_leak
) -> None:
    layout = Layout((Leaf("float32", (4,)),))
    transport, writer = _begun_writer(daemon.unix_target, name, layout)
    behind = WriteBehind(writer, layout)
    try:
        behind.put(2, [np.zeros((2, 4), np.float32)])
        behind.put(1, [np.zeros((1, 3), np.float32)])  # 3 floats where the layout has 4
        with pytest.raises(RecordError, match="does not match"):
            behind.finish()
    finally:
        behind.close()
        transport.close()
    with pytest.raises(CacheNotFoundError):
        cc.info(name)


def test_after_an_element_the_codec_refuses_later_batches_and_finish_commit_nothing(
    daemon, cc, name, no_thread_leak
) -> None:
    """A tapped epoch goes on asking for batches after the error reached the consumer:
    the write lost a batch, so it must not take the next ones and commit short."""
    layout = Layout((Leaf("float32", (4,)),))
    transport, writer = _begun_writer(daemon.unix_target, name, layout)
    behind = WriteBehind(writer, layout)
    try:
        behind.put(1, [np.zeros((1, 3), np.float32)])  # 3 floats where the layout has 4
        with pytest.raises(RecordError, match="does not match"):
            for _ in range(50):  # until the thread has met it and put() raises it
                behind.put(1, [np.zeros((1, 4), np.float32)])
                threading.Event().wait(0.02)
        assert not behind.writing
        behind.put(2, [np.zeros((2, 4), np.float32)])  # dropped, not written
        assert behind.finish() is None
    finally:
        behind.close()
        transport.close()
    with pytest.raises(CacheNotFoundError):
        cc.info(name)


def test_closing_before_finish_cancels_the_write_and_joins_the_thread(
    daemon, cc, name, no_thread_leak
) -> None:
    layout = Layout((Leaf("uint8", (1 << 20,)),))
    transport, writer = _begun_writer(daemon.unix_target, name, layout)
    behind = WriteBehind(writer, layout)
    for _ in range(8):  # more than the queue holds: put() waits on the thread meanwhile
        behind.put(1, [np.ones((1, 1 << 20), np.uint8)])
    behind.close()
    transport.close()
    assert not behind.writing
    with pytest.raises(CacheNotFoundError):
        cc.info(name)


def test_a_finished_write_commits_every_element_in_order(daemon, cc, name) -> None:
    from client.tf.convert import encode_spec

    layout = Layout((Leaf("int64", ()),))
    transport, writer = _begun_writer(
        daemon.unix_target, name, layout, encode_spec(tf.TensorSpec((), tf.int64))
    )
    behind = WriteBehind(writer, layout)
    try:
        for start in range(0, 1000, 100):
            behind.put(100, [np.arange(start, start + 100, dtype=np.int64)])
        cache = behind.finish()
    finally:
        behind.close()
        transport.close()
    assert cache is not None and cache.num_elements == 1000
    assert [int(x) for x in cc.dataset(name)] == list(range(1000))


def test_finish_after_the_daemon_ended_the_stream_raises_instead_of_waiting_forever(
    fresh_daemon, no_thread_leak
) -> None:
    """The request queue is full and nothing reads it once the call is over.

    finish() used to block forever putting its end-of-stream marker there; a
    full disk hit near the end of an epoch hung the epoch this way.
    """
    import threading

    from client.errors import ShardcacheError
    from client.write.stream import _SEND_QUEUE

    layout = Layout((Leaf("uint8", (1 << 10,)),))
    transport, writer = _begun_writer(fresh_daemon.unix_target, "ended", layout)
    try:
        fresh_daemon.kill()  # the call ends with UNAVAILABLE; its request thread stops reading
        call = writer._call
        assert call is not None
        for _ in range(100):
            if call.done():
                break
            threading.Event().wait(0.1)
        assert call.done()
        value = bytes(1 << 10)
        while writer._requests.qsize() < _SEND_QUEUE - 1:  # finish's own request fills it
            writer.add([value] * 1024, raw_bytes=1 << 20)
        outcome: list[BaseException | None] = []

        def finish() -> None:
            try:
                writer.finish()
                outcome.append(None)
            except BaseException as exc:  # reported below
                outcome.append(exc)

        thread = threading.Thread(target=finish, daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive(), "finish() hung on the request queue"
        assert isinstance(outcome[0], ShardcacheError), outcome
    finally:
        writer.abort()
        transport.close()
