"""Readers report to their daemon (ReportReads); the daemon exports them on /metrics, bounded.

One daemon for the module, with /metrics: a real read's figures under its training job and
rank, a thousand readers with distinct labels kept to the daemon's cap, forged and
oversized labels refused. Expiry and the stall's arithmetic: tests/unit/test_readers.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from daemon import Daemon, free_port
from exposition import scrape
from wire import stub

from cacheserver.reader_reports import MAX_READERS
from client import CacheClient
from client.wire.v1 import cache_service_pb2 as pb

tf = pytest.importorskip("tensorflow")
N = 3000


@pytest.fixture(scope="module")
def observed() -> Iterator[Daemon]:
    port = free_port()
    d = Daemon(extra_args=("--metrics-listen", f"127.0.0.1:{port}"))
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    yield d.start()
    d.close()


def series(url: str, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (name, labels), value in scrape(url).items() if name == metric}


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "grpc"])
def test_a_read_reports_what_it_read_by_path_under_its_job_and_rank(observed, direct) -> None:
    name = f"reported-{'direct' if direct else 'grpc'}"
    with CacheClient(observed.unix_target, report=False) as cc:
        list(cc.cache(tf.data.Dataset.range(N), name))
    with CacheClient(observed.unix_target, job="train-a", rank=3) as cc:
        ds = cc.timed(cc.dataset(name, direct=direct, prefetch_bytes=64 << 10))
        assert sum(1 for _ in ds) == N
    # close() sent the last report
    labels = (
        ("cache", name),
        ("path", "direct" if direct else "grpc"),
        ("rank", "3"),
        ("training_job", "train-a"),
    )
    url = observed.metrics_url
    assert series(url, "shardcache_reader_elements_total")[labels] == N
    assert series(url, "shardcache_reader_bytes_total")[labels] == N * 8  # int64
    assert series(url, "shardcache_reader_chunks_total")[labels] >= 1
    assert series(url, "shardcache_reader_chunk_seconds_total")[labels] > 0
    # timed (cc.timed()): the first element was asked for before it was ready
    assert series(url, "shardcache_reader_stall_seconds_total")[labels] > 0


def test_the_job_and_rank_default_from_the_environment(observed, monkeypatch) -> None:
    monkeypatch.setenv("SHARDCACHE_JOB", "from-env")
    monkeypatch.delenv("SHARDCACHE_RANK", raising=False)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}, "task": {"type": "worker", "index": 5}}')
    with CacheClient(observed.unix_target) as cc:
        assert sum(1 for _ in cc.dataset("reported-grpc", direct=False)) == N
    got = series(observed.metrics_url, "shardcache_reader_elements_total")
    assert (
        got[
            (
                ("cache", "reported-grpc"),
                ("path", "grpc"),
                ("rank", "5"),
                ("training_job", "from-env"),
            )
        ]
        == N
    )


def _reader(job: str, cache: str = "c", path: str = "grpc", **figures: float) -> pb.ReaderFigures:
    return pb.ReaderFigures(training_job=job, rank=0, cache=cache, path=path, elements=1, **figures)


def test_a_thousand_readers_with_distinct_labels_keep_the_series_bounded(observed) -> None:
    url = observed.metrics_url
    dropped = scrape(url)[("shardcache_readers_dropped_total", ())]
    with grpc.insecure_channel(observed.unix_target) as ch:
        for batch in range(1000 // 50):
            stub(ch).ReportReads(
                pb.ReportReadsRequest(
                    reporter=f"r{batch}", readers=[_reader(f"job-{batch}-{i}") for i in range(50)]
                ),
                timeout=10,
            )
    got = scrape(url)
    assert len(series(url, "shardcache_reader_elements_total")) == MAX_READERS
    assert got[("shardcache_readers", ())] == MAX_READERS
    assert got[("shardcache_readers_dropped_total", ())] - dropped >= 1000 - MAX_READERS
    # the most recently reported are the ones kept
    assert (
        ("cache", "c"),
        ("path", "grpc"),
        ("rank", "0"),
        ("training_job", "job-19-49"),
    ) in series(url, "shardcache_reader_elements_total")


@pytest.mark.parametrize(
    "request_",
    [
        pb.ReportReadsRequest(reporter="r", readers=[_reader("a\nshardcache_readers 1e9")]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader('x"} 1\nfake{a="')]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("j" * 65)]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("")]),
        pb.ReportReadsRequest(reporter="r\x1b[2J", readers=[_reader("ok")]),
        pb.ReportReadsRequest(reporter="r" * 65, readers=[_reader("ok")]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("ok", cache="../etc")]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("ok", path="carrier-pigeon")]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("ok", stall_seconds=float("nan"))]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("ok", chunk_seconds=-1.0)]),
        pb.ReportReadsRequest(reporter="r", readers=[_reader("ok")] * 65),
    ],
    ids=[
        "newline",
        "quotes",
        "oversized",
        "empty",
        "escape-in-reporter",
        "long-reporter",
        "bad-cache",
        "bad-path",
        "nan",
        "negative",
        "too-many",
    ],
)
def test_forged_and_oversized_reports_are_refused_and_leave_nothing(observed, request_) -> None:
    with grpc.insecure_channel(observed.unix_target) as ch, pytest.raises(grpc.RpcError) as err:
        stub(ch).ReportReads(request_, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ok" not in {
        dict(labels).get("training_job")
        for labels in series(observed.metrics_url, "shardcache_reader_elements_total")
    }


def test_a_client_refuses_a_job_name_the_daemon_would_refuse() -> None:
    from client import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="1-64 of"):
        CacheClient("127.0.0.1:1", job="my job")
    with pytest.raises(InvalidArgumentError, match="rank"):
        CacheClient("127.0.0.1:1", rank=-1)
