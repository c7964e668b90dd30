"""The edge's request checks (cacheserver/rpc/validate.py), the layout's bounds, log escaping."""

from __future__ import annotations

import json

import pytest

from cacheserver.catalog.manifest import CacheRecord, ShardInfo
from cacheserver.logs import shown
from cacheserver.rpc import admission, validate
from client.format.layout import MAX_ELEMENT_BYTES, MAX_LAYOUT_DEPTH, Layout
from client.wire.status import InvalidArgument
from client.wire.v1 import cache_service_pb2 as pb


def test_a_layout_nested_past_the_bound_is_refused_before_parsing() -> None:
    with pytest.raises(ValueError, match="nested 100000 deep"):
        Layout.from_json("[" * 100_000 + "]" * 100_000)
    nested_in_a_string = json.dumps({"format": 1, "leaves": [], "x": '[[[[[[[[[[[[[[[[\\"['})
    assert Layout.from_json(nested_in_a_string).leaves == ()
    with pytest.raises(ValueError, match=f"at most {MAX_LAYOUT_DEPTH} deep"):
        Layout.from_json('{"format": 1, "leaves": [[[[[[[[[]]]]]]]]]}')


@pytest.mark.parametrize(
    "leaf",
    [
        {"dtype": "float32", "shape": [65536, 65536, 65536]},
        {"dtype": "uint8", "shape": [None, 1 << 40]},
        {"dtype": "string", "shape": [1 << 40]},
    ],
)
def test_a_leaf_larger_than_an_element_may_be_is_refused(leaf: dict) -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_ELEMENT_BYTES} bytes"):
        Layout.from_json(json.dumps({"format": 1, "leaves": [leaf]}))


def test_blocks_whose_body_passes_the_bound_are_refused() -> None:
    doc = {
        "format": 2,
        "block_elements": 1 << 40,
        "block_shuffle": 1,
        "leaves": [{"dtype": "int64", "shape": []}],
    }
    with pytest.raises(ValueError, match="a block's body may take at most"):
        Layout.from_json(json.dumps(doc))


def test_a_write_begin_is_checked_field_by_field() -> None:
    layout = '{"format": 1, "leaves": []}'
    assert validate.write_begin("c", "graph:ab-cd", layout, b"", 0).leaves == ()
    for args, what in [
        (("", "f", layout, b"", 0), "empty"),
        (("c", "", layout, b"", 0), "fingerprint is empty"),
        (("c", "f\n", layout, b"", 0), "control characters"),
        (("c", "f", "{}", b"", 0), "layout_json"),
        (("c", "f", layout, b"", 1 << 50), "shard_bytes"),
        (("c", "f", layout, b"x" * (2 << 20), 0), "element_spec"),
    ]:
        with pytest.raises(InvalidArgument, match=what):
            validate.write_begin(*args)


def test_raw_bytes_are_bounded_by_the_stored_bytes_received() -> None:
    validate.write_chunk(b"\0" * 8, 10, 10 * 32768)
    with pytest.raises(InvalidArgument, match="raw_bytes"):
        validate.write_chunk(b"\0" * 8, 10, 10 * 32768 + 1)
    with pytest.raises(InvalidArgument, match="u32"):
        validate.write_chunk(b"\0" * 7, 10, 0)


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), -1.0, 1e300])
def test_a_ttl_must_be_finite_and_in_range(ttl: float) -> None:
    with pytest.raises(InvalidArgument, match="ttl_seconds"):
        validate.retention("c", ttl)


def test_an_unparseable_message_becomes_invalid_argument_not_an_exception_in_grpc() -> None:
    parse = admission.checked(pb.GetCacheRequest.FromString, "/x/GetCache")
    assert parse is not None
    assert admission.accepted(parse(pb.GetCacheRequest(name="c").SerializeToString())).name == "c"
    garbage = parse(b"\xff\xff\xff")
    assert isinstance(garbage, admission.Refused)
    with pytest.raises(InvalidArgument, match="not a valid message"):
        admission.accepted(garbage)


def test_client_strings_in_logs_are_escaped_and_truncated() -> None:
    assert shown("a\nb\x1b") == "a\\nb\\x1b"
    long = shown("y" * (10 << 20))
    assert len(long) < 250 and long.endswith(f"...({(10 << 20) - 200} more chars)")


def _record(**shard: int) -> CacheRecord:
    info = dict(index=0, first_element=0, num_elements=1, stored_bytes=1, raw_bytes=1) | shard
    return CacheRecord("c", "f", "{}", b"", "READY", 1.0, 2.0, [ShardInfo(**info)], 4096)


def test_a_record_that_cannot_be_encoded_does_not_load() -> None:
    assert CacheRecord.from_json(_record().to_json()).shards[0].raw_bytes == 1
    for bad in (
        _record(raw_bytes=1 << 65).to_json(),
        _record(index=3).to_json(),
        _record(num_elements=-1).to_json(),
        '{"name": "c"',
        "[]",
        "{}",
    ):
        with pytest.raises(ValueError):
            CacheRecord.from_json(bad)
