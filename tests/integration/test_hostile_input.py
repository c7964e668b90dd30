"""Hostile and careless requests against a real daemon: refused at the edge, nothing committed.

Each request here once reached deep code (an overflowing raw_bytes total, a deeply
nested or absurd layout, huge integers, names that forge log lines); now each is
INVALID_ARGUMENT (or OUT_OF_RANGE) with a message saying what is allowed, the
daemon's log has no traceback for it, and every other caller is unaffected.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator, Sequence

import grpc
import pytest
from daemon import Daemon
from wire import LAYOUT, names, reason, records, stub, write_cache

from client.wire.v1 import cache_service_pb2 as pb

U64_MAX = (1 << 64) - 1
BAD = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)


def _chunk(values: Sequence[bytes], raw_bytes: int | None = None) -> pb.WriteChunk:
    return pb.WriteChunk(
        lengths=struct.pack(f"<{len(values)}I", *map(len, values)),
        data=b"".join(values),
        raw_bytes=sum(map(len, values)) if raw_bytes is None else raw_bytes,
    )


def _write(
    channel: grpc.Channel,
    begin: pb.WriteBegin,
    chunks: Sequence[pb.WriteChunk] = (),
    num_elements: int | None = None,
) -> list[pb.WriteCacheResponse]:
    def requests() -> Iterator[pb.WriteCacheRequest]:
        yield pb.WriteCacheRequest(begin=begin)
        for chunk in chunks:
            yield pb.WriteCacheRequest(chunk=chunk)
        n = sum(len(c.lengths) // 4 for c in chunks) if num_elements is None else num_elements
        yield pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=n))

    return list(stub(channel).WriteCache(requests(), timeout=30))


class _LogWindow:
    """What the daemon logs from now on."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self._start = daemon.log_path.stat().st_size

    def text(self, until: str = "", deadline_s: float = 10.0) -> str:
        """The log since the window opened, once it holds `until` (the request log line is
        written as the call ends, just after the caller has its status)."""
        give_up = time.monotonic() + deadline_s
        while True:
            with open(self._daemon.log_path, "rb") as f:
                f.seek(self._start)
                text = f.read().decode(errors="replace")
            if until in text or time.monotonic() > give_up:
                return text


def _refused(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):
            list(result)
    return info.value


def test_a_write_whose_raw_bytes_overflow_is_refused_and_commits_nothing(
    fresh_daemon: Daemon,
) -> None:
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        write_cache(ch, "kept", records(3, 64))
        log = _LogWindow(fresh_daemon)
        values = records(2, 64)
        err = _refused(
            _write,
            ch,
            pb.WriteBegin(name="overflow", fingerprint="f", layout_json=LAYOUT),
            [_chunk(values, U64_MAX), _chunk(values, U64_MAX)],
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert reason(err) == "INVALID_ARGUMENT"
        assert "raw_bytes" in err.details()
        assert names(ch) == ["kept"]
        assert "Traceback" not in log.text(until="WriteCache cache=overflow")
    fresh_daemon.restart()
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        assert names(ch) == ["kept"]


def test_a_write_declaring_more_raw_bytes_than_its_data_can_hold_is_refused(
    daemon: Daemon, name: str
) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        err = _refused(
            _write,
            ch,
            pb.WriteBegin(name=name, fingerprint="f", layout_json=LAYOUT),
            [_chunk([b"x" * 10], 1 << 40)],
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw_bytes" in err.details()
        assert name not in names(ch)


@pytest.mark.parametrize(
    "layout_json, what",
    [
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"format": 1, "leaves": ' + "[" * 5000 + "]" * 5000 + "}", "nested"),
        (
            '{"format":2,"block_elements":2,"block_shuffle":1,'
            '"leaves":[{"dtype":"uint8","shape":[1099511627776, 8]}]}',
            "bytes",
        ),
        ('{"format":1,"leaves":[{"dtype":"uint8","shape":[' + str(10**30) + "]}]}", "dimension"),
        ('{"format":1,"leaves":[{"dtype":"float32","shape":[65536, 65536, 65536]}]}', "bytes"),
        (
            '{"format":2,"block_elements":' + str(1 << 62) + ',"block_shuffle":1,'
            '"leaves":[{"dtype":"int64","shape":[]}]}',
            "bytes",
        ),
        ('{"format":1,"leaves":[{"dtype":"object","shape":[]}]}', "dtype"),
        ('{"format":1,"leaves":[{"dtype":"int8","shape":[1e400]}]}', "shape"),
        ('{"format":1,"leaves":[{"dtype":"int8","shape":[' + "9" * 5000 + "]}]}", "layout"),
        (
            '{"format":1,"leaves":['
            + '{"dtype":"int8","shape":[]},' * 20_000
            + '{"dtype":"int8","shape":[]}]}',
            "leaves",
        ),
        ("{}", "format"),
        ("", "layout"),
        ("\ud800", "layout"),
    ],
)
def test_a_write_with_a_bad_layout_is_refused_and_commits_nothing(
    daemon: Daemon, name: str, layout_json: str, what: str
) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        log = _LogWindow(daemon)
        try:
            begin = pb.WriteBegin(name=name, fingerprint="f", layout_json=layout_json)
        except ValueError:  # a lone surrogate is no UTF-8: send the bytes by hand below
            begin = pb.WriteBegin(name=name, fingerprint="f", layout_json="x")
        err = _refused(_write, ch, begin, [_chunk([b"abc"])], 2)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert what in err.details() and "layout" in err.details(), err.details()
        assert len(err.details()) < 1000
        assert name not in names(ch)
        assert "Traceback" not in log.text(until=f"WriteCache cache={name}")


def test_a_cache_of_an_absurd_layout_never_exists_so_reads_cannot_allocate_for_it(
    daemon: Daemon, name: str
) -> None:
    absurd = (
        '{"format":2,"block_elements":2,"block_shuffle":1,'
        '"leaves":[{"dtype":"uint8","shape":[1099511627776, 8]}]}'
    )
    with grpc.insecure_channel(daemon.unix_target) as ch:
        _refused(
            _write,
            ch,
            pb.WriteBegin(name=name, fingerprint="f", layout_json=absurd),
            [_chunk([b"abc"])],
            2,
        )
        err = _refused(
            stub(ch).ReadElements,
            pb.ReadElementsRequest(name=name, indices=struct.pack("<Q", 0)),
            timeout=10,
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    "begin, what",
    [
        (pb.WriteBegin(fingerprint="f", layout_json=LAYOUT, shard_bytes=U64_MAX), "shard_bytes"),
        (pb.WriteBegin(fingerprint="f" * 10_000, layout_json=LAYOUT), "fingerprint"),
        (pb.WriteBegin(fingerprint="f\nINFO forged", layout_json=LAYOUT), "fingerprint"),
        (
            pb.WriteBegin(fingerprint="f", layout_json=LAYOUT, element_spec=b"s" * (2 << 20)),
            "element_spec",
        ),
    ],
)
def test_write_begins_out_of_bounds_are_refused_with_what_is_allowed(
    daemon: Daemon, name: str, begin: pb.WriteBegin, what: str
) -> None:
    begin.name = name
    with grpc.insecure_channel(daemon.unix_target) as ch:
        log = _LogWindow(daemon)
        err = _refused(_write, ch, begin, [_chunk([b"abc"])])
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert what in err.details()
        assert len(err.details()) < 1000
        assert name not in names(ch)
        assert "Traceback" not in log.text(until=f"WriteCache cache={name}")


def test_a_finish_counting_more_elements_than_a_u64_total_allows_is_refused(
    daemon: Daemon, name: str
) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        err = _refused(
            _write,
            ch,
            pb.WriteBegin(name=name, fingerprint="f", layout_json=LAYOUT),
            [_chunk([b"abc"])],
            U64_MAX,
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert name not in names(ch)


@pytest.mark.parametrize(
    "field, value",
    [
        ("ttl_seconds", float("inf")),
        ("ttl_seconds", float("nan")),
        ("ttl_seconds", -1.0),
        ("ttl_seconds", 1e308),
    ],
)
def test_a_retention_out_of_range_is_refused(
    daemon: Daemon, name: str, field: str, value: float
) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        write_cache(ch, name, records(1, 16))
        err = _refused(
            stub(ch).SetCacheRetention,
            pb.SetCacheRetentionRequest(name=name, **{field: value}),
            timeout=10,
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "ttl_seconds" in err.details()
        assert stub(ch).GetCache(pb.GetCacheRequest(name=name), timeout=10).cache.ttl_seconds == 0


@pytest.mark.parametrize("interval", [float("nan"), float("inf"), -1.0, 1e308])
def test_a_watch_interval_out_of_range_is_refused(daemon: Daemon, interval: float) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        err = _refused(
            stub(ch).WatchOperation,
            pb.WatchOperationRequest(name="materialize/x", interval=interval),
            timeout=10,
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "interval" in err.details()


@pytest.mark.parametrize(
    "call, request_",
    [
        ("GetOperation", pb.GetOperationRequest(name="o" * 10_000)),
        ("CancelOperation", pb.CancelOperationRequest(name="materialize/\n")),
        ("RenewReadLease", pb.RenewReadLeaseRequest(lease_id="l" * 10_000)),
        ("ReleaseReadLease", pb.ReleaseReadLeaseRequest(lease_id="l" * 10_000)),
        ("AcquireReadLease", pb.AcquireReadLeaseRequest(name="c", fingerprint="f" * 10_000)),
        ("ReadShard", pb.ReadShardRequest(name="c", fingerprint="f" * 10_000)),
        ("ReadElements", pb.ReadElementsRequest(name="c", indices=b"\0" * 7)),
        ("ReadElements", pb.ReadElementsRequest(name="c", indices=b"\0" * 8 * 65537)),
        ("DeleteCache", pb.DeleteCacheRequest(name="../etc")),
    ],
)
def test_control_requests_out_of_bounds_are_refused_at_the_edge(
    daemon: Daemon, call: str, request_: object
) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        log = _LogWindow(daemon)
        err = _refused(getattr(stub(ch), call), request_, timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert len(err.details()) < 1000
        assert "Traceback" not in log.text(until=f"{call} cache=")


def test_an_unparseable_request_is_invalid_argument_without_a_traceback(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        log = _LogWindow(daemon)
        for garbage in (b"\xff\xff\xff", b"\x0a\x02\xff\xfe"):  # corrupt; bad UTF-8
            err = _refused(
                ch.unary_unary("/cacheserver.v1.CacheService/GetCache"), garbage, timeout=10
            )
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        err = _refused(
            ch.unary_stream("/cacheserver.v1.CacheService/ReadShard"), b"\xff", timeout=10
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert names(ch) is not None  # still serving
        assert "Traceback" not in log.text(until="ReadShard cache=")


# ------------------------------------------------------------ broken caches on disk


def _break_manifest(daemon: Daemon, name: str, how: str) -> None:
    manifest = daemon.data_dir / "caches" / name / "manifest.json"
    if how == "unencodable":  # what an unchecked commit of overflowing raw_bytes left
        doc = json.loads(manifest.read_text())
        doc["shards"][0]["raw_bytes"] = 1 << 65
        manifest.write_text(json.dumps(doc))
    else:
        manifest.write_text('{"name": "' + name + '", "shards": [')


@pytest.mark.parametrize("how", ["unencodable", "unparseable"])
def test_a_cache_whose_manifest_is_broken_is_skipped_by_list_reported_by_info_and_removable(
    fresh_daemon: Daemon, how: str
) -> None:
    from client import CacheClient
    from client.errors import DataLossError

    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        write_cache(ch, "good", records(2, 32))
        write_cache(ch, "bad", records(2, 32))
    fresh_daemon.kill()
    _break_manifest(fresh_daemon, "bad", how)
    fresh_daemon.start()
    for _ in range(2):  # and the same after another restart
        with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
            assert names(ch) == ["good"]
            err = _refused(stub(ch).GetCache, pb.GetCacheRequest(name="bad"), timeout=10)
            assert err.code() == grpc.StatusCode.DATA_LOSS, err.details()
            assert "manifest.json" in err.details() and "cacheserver rm bad" in err.details()
            err = _refused(stub(ch).ReadShard, pb.ReadShardRequest(name="bad"), timeout=10)
            assert err.code() == grpc.StatusCode.DATA_LOSS
        with CacheClient(fresh_daemon.unix_target) as cc, pytest.raises(DataLossError):
            cc.info("bad")
        fresh_daemon.restart()
    log = fresh_daemon.log()
    assert "cache 'bad' is broken" in log
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        stub(ch).DeleteCache(pb.DeleteCacheRequest(name="bad"), timeout=10)
        err = _refused(stub(ch).GetCache, pb.GetCacheRequest(name="bad"), timeout=10)
        assert err.code() == grpc.StatusCode.NOT_FOUND
        write_cache(ch, "bad", records(1, 8))  # the name is free again
        assert names(ch) == ["bad", "good"]
    assert not (fresh_daemon.data_dir / "trash").exists() or not any(
        (fresh_daemon.data_dir / "trash").iterdir()
    )


# ------------------------------------------------------------ logs


def test_a_huge_or_multiline_name_adds_a_bounded_escaped_line_to_the_log(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        log = _LogWindow(daemon)
        for size in (10 << 20, 20_000, 50):
            name = "x\n2099-01-01 00:00:00,000 INFO forged: " + "y" * size
            err = _refused(stub(ch).GetCache, pb.GetCacheRequest(name=name), timeout=30)
            assert err.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            )
            err = _refused(
                _write, ch, pb.WriteBegin(name=name, fingerprint="f", layout_json=LAYOUT)
            )
        text = log.text(until="GetCache cache=")
    assert len(text.encode()) < 8 * 1024, len(text)
    assert not any(line.startswith("2099-") for line in text.splitlines()), text
    assert "more chars" in text


def test_json_logs_carry_client_strings_as_truncated_fields() -> None:
    d = Daemon(extra_args=("--log-format", "json")).start()
    try:
        with grpc.insecure_channel(d.unix_target) as ch:
            log = _LogWindow(d)
            name = 'x\n{"level": "ERROR"}' + "y" * 20_000
            _refused(stub(ch).GetCache, pb.GetCacheRequest(name=name), timeout=10)
            text = log.text(until='"GetCache')
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        request = next(doc for doc in lines if doc.get("method") == "GetCache")
        assert request["cache"].startswith("x\\n") and len(request["cache"]) < 400
        assert all(len(line) < 2048 for line in text.splitlines())
    finally:
        d.close()
