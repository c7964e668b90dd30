"""Readers that stop reading: health and control calls are still served; idle streams end."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from daemon import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from wire import records, split, stub, write_cache

from client.wire.v1 import cache_service_pb2 as pb

PAUSED_READERS = 72  # more than the 64 serving threads the daemon used to have in all
#: A connection of its own, and no window growth: the transport soon stops taking data.
_PAUSED_READER = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)]


def _cache(d: Daemon) -> list[bytes]:
    """A cache far larger than what the transport buffers for one paused stream."""
    data = records(128, 256 << 10)
    with grpc.insecure_channel(d.unix_target) as ch:
        write_cache(ch, "big", data)
    return data


def _pause(channels: list[grpc.Channel], n: int) -> tuple[list[Iterator], int]:
    """Open n ReadShard streams, take one chunk of each, then stop reading.

    Returns the streams still open and how many the daemon refused with
    RESOURCE_EXHAUSTED (its stream limits).
    """
    held, refused = [], 0
    for i in range(n):
        call = stub(channels[i % len(channels)]).ReadShard(
            pb.ReadShardRequest(name="big", chunk_bytes=256 << 10), timeout=60
        )
        try:
            next(call)
            held.append(call)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            refused += 1
    return held, refused


def _answers_within(seconds: float, rpc: object, *args: object) -> None:
    start = time.monotonic()
    rpc(*args, timeout=seconds)  # type: ignore[operator]
    assert time.monotonic() - start < seconds


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    d = Daemon().start()
    yield d
    d.close()


def test_health_and_control_calls_answer_within_a_second_while_readers_are_paused(
    daemon: Daemon,
) -> None:
    _cache(daemon)
    channels = [grpc.insecure_channel(daemon.tcp_target, options=_PAUSED_READER) for _ in range(8)]
    try:
        held, refused = _pause(channels, PAUSED_READERS)
        assert held and refused, "the stream limits cap one host's streams below the threads"
        with grpc.insecure_channel(daemon.unix_target) as ch:
            for _ in range(5):
                _answers_within(
                    1.0, health_pb2_grpc.HealthStub(ch).Check, health_pb2.HealthCheckRequest()
                )
                _answers_within(1.0, stub(ch).GetCache, pb.GetCacheRequest(name="big"))
                _answers_within(1.0, stub(ch).ListCaches, pb.ListCachesRequest())
        for call in held:
            call.cancel()
    finally:
        for ch in channels:
            ch.close()


def test_a_reader_that_stops_reading_is_ended_after_the_idle_timeout() -> None:
    d = Daemon(extra_args=("--stream-idle-timeout", "2")).start()
    try:
        data = _cache(d)
        with grpc.insecure_channel(d.tcp_target, options=_PAUSED_READER) as ch:
            (paused,), _ = _pause([ch], 1)
            deadline = time.monotonic() + 30
            while "idle" not in d.log() and time.monotonic() < deadline:
                time.sleep(0.1)  # the daemon logs the end of the stream
            with pytest.raises(grpc.RpcError) as err:
                for _ in paused:  # what was buffered, then the status
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "--stream-idle-timeout" in err.value.details()
            # a reader that keeps reading is not idle, however long the stream
            got = [
                r
                for chunk in stub(ch).ReadShard(
                    pb.ReadShardRequest(name="big", chunk_bytes=256 << 10), timeout=60
                )
                for r in split(chunk)
            ]
            assert got == data
        assert "Traceback" not in d.log()
    finally:
        d.close()
