"""Generated requests for every RPC, well-formed and hostile, against a real daemon.

Each test draws requests with hypothesis (names of any length and character,
absurd sizes and counts, layouts nested, huge or malformed, chunks whose
metadata lies about their bytes, messages out of order) and sends them over
raw gRPC. Whatever is sent, the daemon answers with a documented status (never
INTERNAL or UNKNOWN), writes no traceback to its log, stays healthy, and a
cache written before the run reads back unchanged afterwards.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from daemon import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire import read_all, records, stub, write_cache

from client.wire.v1 import cache_service_pb2 as pb

#: What the daemon may answer to a generated request (docs/protocol.md, "Errors").
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.CANCELLED,
}
KEEP = "fuzz-keep"  # written before the run; no generated request may change it
U32, U64 = 2**32 - 1, 2**64 - 1
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[Daemon, grpc.Channel, list[bytes]]]:
    daemon = Daemon().start()
    kept = records(40, 3000, 7)
    with grpc.insecure_channel(daemon.unix_target) as channel:
        write_cache(channel, KEEP, kept)
        yield daemon, channel, kept
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert read_all(channel, KEEP) == kept, "a generated request changed a cache"
    daemon.restart()  # what the run left on disk must not poison the next start
    with grpc.insecure_channel(daemon.unix_target) as channel:
        assert KEEP in {
            c.name for c in stub(channel).ListCaches(pb.ListCachesRequest(), timeout=10).caches
        }
        assert read_all(channel, KEEP) == kept
    log = daemon.log()
    daemon.close()
    assert "Traceback" not in log, log[-4000:]
    assert "INTERNAL" not in log, log[-4000:]


def _answer(call: Any) -> grpc.StatusCode:
    """Run a call (a unary result or a stream to drain); its status code."""
    try:
        result = call()
        if isinstance(result, Iterator):
            for _ in result:
                pass
    except grpc.RpcError as err:
        code = err.code()
        assert code in DOCUMENTED, (code, err.details())
        return code
    return grpc.StatusCode.OK


# ---------------------------------------------------------------- strategies

names = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "../x",
            "/etc",
            "a/b",
            "x" * 300,
            "nl\nforged INFO line",
            "\x00",
            "-rf",
            KEEP,
        ]
    ),
    st.integers(200, 2_000_000).map(lambda n: "a" * n),
)
mutable_names = names.filter(lambda n: n != KEEP)
valid_names = st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True).filter(lambda n: n != KEEP)
write_names = st.one_of(valid_names, valid_names, valid_names, mutable_names)
fingerprints = st.one_of(st.just("fp"), st.text(max_size=20), st.just(f"fp-{KEEP}"))
big_ints = st.one_of(st.integers(0, 8), st.integers(0, U64))
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=10),
)
any_json = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
dtypes = st.sampled_from(
    ["float32", "int64", "uint8", "string", "bool", "complex128", "float8", "", "object", "V8"]
)
dims = st.one_of(
    st.none(),
    st.integers(-5, 64),
    st.integers(-5, 2**63),
    st.sampled_from([2**31, 2**40, 2**64, 10**30]),
)
leaves = st.fixed_dictionaries({"dtype": dtypes, "shape": st.lists(dims, max_size=6)})


@st.composite
def layouts(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return "{}"
    if kind == 1:
        return draw(st.text(max_size=50))
    if kind == 2:
        depth = draw(st.sampled_from([1, 8, 9, 50, 999, 2000, 100_000]))
        return "[" * depth + "]" * depth
    if kind == 3:
        return json.dumps(draw(any_json))
    doc: dict[str, Any] = {"leaves": draw(st.lists(leaves, max_size=4))}
    if kind == 5:
        doc["block_elements"] = draw(st.integers(-3, 2**64))
        doc["format"] = draw(st.integers(-1, 5))
    return json.dumps(doc)


@st.composite
def chunks(draw: st.DrawFn) -> pb.WriteChunk:
    data = draw(st.binary(max_size=200))
    if draw(st.booleans()):  # lengths that agree with the data
        cut = sorted(draw(st.lists(st.integers(0, len(data)), max_size=5)))
        bounds = [0, *cut, len(data)]
        lengths = struct.pack(
            f"<{len(bounds) - 1}I", *(b - a for a, b in itertools.pairwise(bounds))
        )
    else:
        lengths = draw(st.binary(max_size=24))
    return pb.WriteChunk(lengths=lengths, data=data, raw_bytes=draw(big_ints))


begins = st.builds(
    pb.WriteBegin,
    name=write_names,
    fingerprint=fingerprints,
    layout_json=layouts(),
    element_spec=st.binary(max_size=20),
    shard_bytes=big_ints,
    local=st.booleans(),
)
staged = st.builds(
    pb.StagedShard,
    index=st.integers(0, U32),
    num_elements=big_ints,
    num_records=big_ints,
    stored_bytes=big_ints,
    raw_bytes=big_ints,
)
finishes = st.builds(
    pb.WriteFinish,
    num_elements=big_ints,
    staged_shards=st.lists(staged, max_size=2),
    failed=st.text(max_size=5),
)
write_messages = st.one_of(
    begins.map(lambda m: pb.WriteCacheRequest(begin=m)),
    chunks().map(lambda m: pb.WriteCacheRequest(chunk=m)),
    finishes.map(lambda m: pb.WriteCacheRequest(finish=m)),
    st.just(pb.WriteCacheRequest()),
)


@st.composite
def write_streams(draw: st.DrawFn) -> list[pb.WriteCacheRequest]:
    if draw(st.integers(0, 3)):  # a plausible write: begin, chunks, finish
        begin = draw(begins)
        if draw(st.booleans()):
            begin.fingerprint, begin.local, begin.shard_bytes = "fp", False, 0
        parts = draw(st.lists(chunks(), max_size=4))
        finish = draw(finishes)
        if draw(st.booleans()):  # the count the chunks' lengths say
            finish = pb.WriteFinish(num_elements=sum(len(c.lengths) // 4 for c in parts))
        return [
            pb.WriteCacheRequest(begin=begin),
            *(pb.WriteCacheRequest(chunk=c) for c in parts),
            pb.WriteCacheRequest(finish=finish),
        ]
    return draw(st.lists(write_messages, max_size=5))


# ---------------------------------------------------------------- tests


@FUZZ
@given(name=names)
def test_cache_queries_answer_with_documented_statuses(fuzzed, name: str) -> None:
    _, channel, _ = fuzzed
    s = stub(channel)
    _answer(lambda: s.GetCache(pb.GetCacheRequest(name=name), timeout=10))
    _answer(lambda: s.ListCaches(pb.ListCachesRequest(), timeout=10))


@FUZZ
@given(
    name=mutable_names,
    pinned=st.none() | st.booleans(),
    ttl=st.none() | st.floats(allow_nan=True, allow_infinity=True),
)
def test_deletes_and_retention_changes_answer_with_documented_statuses(
    fuzzed, name: str, pinned: bool | None, ttl: float | None
) -> None:
    _, channel, _ = fuzzed
    s = stub(channel)
    request = pb.SetCacheRetentionRequest(name=name)
    if pinned is not None:
        request.pinned = pinned
    if ttl is not None:
        request.ttl_seconds = ttl
    _answer(lambda: s.SetCacheRetention(request, timeout=10))
    _answer(lambda: s.DeleteCache(pb.DeleteCacheRequest(name=name), timeout=10))


@FUZZ
@given(messages=write_streams())
def test_write_streams_answer_with_documented_statuses(fuzzed, messages) -> None:
    _, channel, _ = fuzzed
    _answer(lambda: stub(channel).WriteCache(iter(messages), timeout=30))


@FUZZ
@given(
    name=names,
    shard=st.integers(0, U32),
    start=big_ints,
    count=big_ints,
    chunk_bytes=st.integers(0, U32),
    fingerprint=fingerprints,
    epoch_start=st.booleans(),
)
def test_shard_reads_answer_with_documented_statuses(
    fuzzed, name, shard, start, count, chunk_bytes, fingerprint, epoch_start
) -> None:
    _, channel, _ = fuzzed
    request = pb.ReadShardRequest(
        name=name,
        shard=shard,
        start=start,
        count=count,
        chunk_bytes=chunk_bytes,
        fingerprint=fingerprint,
        epoch_start=epoch_start,
    )
    _answer(lambda: stub(channel).ReadShard(request, timeout=30))


@FUZZ
@given(
    name=names,
    indices=st.one_of(
        st.binary(max_size=100),
        st.lists(st.integers(0, 60), max_size=50).map(lambda xs: struct.pack(f"<{len(xs)}Q", *xs)),
        st.integers(0, 70_000).map(lambda n: b"\0" * 8 * n),
    ),
    chunk_bytes=st.integers(0, U32),
    fingerprint=fingerprints,
)
def test_element_reads_answer_with_documented_statuses(
    fuzzed, name, indices, chunk_bytes, fingerprint
) -> None:
    _, channel, _ = fuzzed
    request = pb.ReadElementsRequest(
        name=name, indices=indices, chunk_bytes=chunk_bytes, fingerprint=fingerprint
    )
    _answer(lambda: stub(channel).ReadElements(request, timeout=30))


@FUZZ
@given(name=names, fingerprint=fingerprints, lease=st.text(max_size=40), epoch_start=st.booleans())
def test_read_leases_answer_with_documented_statuses(
    fuzzed, name, fingerprint, lease, epoch_start
) -> None:
    _, channel, _ = fuzzed
    s = stub(channel)
    _answer(
        lambda: s.AcquireReadLease(
            pb.AcquireReadLeaseRequest(name=name, fingerprint=fingerprint, epoch_start=epoch_start),
            timeout=10,
        )
    )
    _answer(lambda: s.RenewReadLease(pb.RenewReadLeaseRequest(lease_id=lease), timeout=10))
    _answer(lambda: s.ReleaseReadLease(pb.ReleaseReadLeaseRequest(lease_id=lease), timeout=10))


entry_points = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "os:kill",
            "os:_exit",
            "shutil:rmtree",
            "builtins:exec",
            "os:system",
            "subprocess:run",
            "sys:exit",
            ":",
            "a:",
            ":b",
            "x" * 5000,
        ]
    ),
)


@FUZZ
@given(
    name=mutable_names,
    entry=entry_points,
    graph=st.binary(max_size=40),
    spec=st.binary(max_size=20),
    shards=st.integers(0, U32),
    workers=st.integers(0, U32),
    overwrite=st.booleans(),
    resume=st.booleans(),
    block=st.none() | st.integers(0, U32),
    interval=st.floats(allow_nan=True, allow_infinity=True),
)
def test_materialization_requests_answer_with_documented_statuses(
    fuzzed, name, entry, graph, spec, shards, workers, overwrite, resume, block, interval
) -> None:
    _, channel, _ = fuzzed
    s = stub(channel)
    request = pb.StartMaterializeRequest(
        name=name, num_shards=shards, workers=workers, overwrite=overwrite, resume=resume
    )
    if entry or not graph:
        request.entry_point = entry
    else:
        request.graph_def, request.element_spec = graph, spec
    if block is not None:
        request.block_bytes = block
    code = _answer(lambda: s.StartMaterialize(request, timeout=30))
    op = f"materialize/{name}"
    if code == grpc.StatusCode.OK:  # nothing generated may run: stop it at once
        _answer(lambda: s.CancelOperation(pb.CancelOperationRequest(name=op), timeout=30))
    _answer(lambda: s.GetOperation(pb.GetOperationRequest(name=op), timeout=10))
    if not math.isnan(interval) and interval != 0:
        request_watch = pb.WatchOperationRequest(name=op, interval=interval)
        _answer(lambda: next(iter(s.WatchOperation(request_watch, timeout=5)), None))
