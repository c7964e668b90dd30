"""client/wire/chunks.py: WriteCache chunks framed by hand, read back as views."""

from __future__ import annotations

import struct

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from client.wire.chunks import (
    ChunkView,
    decode_request,
    encode_chunk_request,
    encode_read_shard_response,
    read_shard_data_bytes,
    serialize_request,
)
from client.wire.v1 import cache_service_pb2 as pb

values_st = st.lists(st.binary(max_size=300), max_size=20)


def _lengths(values: list[bytes]) -> bytes:
    return struct.pack(f"<{len(values)}I", *map(len, values))


@given(values_st, st.integers(0, 2**64 - 1))
def test_a_framed_chunk_is_byte_for_byte_what_protobuf_serializes(values, raw_bytes) -> None:
    lengths = _lengths(values)
    expected = pb.WriteCacheRequest(
        chunk=pb.WriteChunk(lengths=lengths, data=b"".join(values), raw_bytes=raw_bytes)
    ).SerializeToString()
    assert encode_chunk_request(lengths, values, raw_bytes) == expected


@given(values_st, st.integers(0, 2**64 - 1))
def test_a_received_chunk_reads_as_protobuf_would_read_it(values, raw_bytes) -> None:
    message = encode_chunk_request(_lengths(values), [memoryview(v) for v in values], raw_bytes)
    view = decode_request(message)
    parsed = pb.WriteCacheRequest.FromString(message)
    assert view.WhichOneof("request") == parsed.WhichOneof("request")
    assert bytes(view.chunk.lengths) == parsed.chunk.lengths
    assert bytes(view.chunk.data) == parsed.chunk.data
    assert view.chunk.raw_bytes == parsed.chunk.raw_bytes


def test_a_received_chunk_s_data_is_a_view_into_the_message_not_a_copy() -> None:
    message = encode_chunk_request(_lengths([b"abc", b"de"]), [b"abc", b"de"], 5)
    view = decode_request(message)
    assert isinstance(view, ChunkView)
    assert isinstance(view.chunk.data, memoryview) and view.chunk.data.obj is message
    assert view.DESCRIPTOR is pb.WriteCacheRequest.DESCRIPTOR


@pytest.mark.parametrize(
    "request_",
    [
        pb.WriteCacheRequest(begin=pb.WriteBegin(name="x", fingerprint="f")),
        pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=3)),
        pb.WriteCacheRequest(),
    ],
    ids=["begin", "finish", "empty"],
)
def test_begin_finish_and_empty_requests_are_parsed_by_protobuf(request_) -> None:
    message = serialize_request(request_)
    decoded = decode_request(message)
    assert isinstance(decoded, pb.WriteCacheRequest)
    assert decoded == request_


def test_a_chunk_with_a_field_this_module_does_not_know_keeps_it_through_protobuf() -> None:
    known = encode_chunk_request(_lengths([b"ab"]), [b"ab"], 2)
    unknown_field = bytes([10 << 3 | 0, 7])  # WriteChunk field 10 (varint) = 7, a newer client
    inner = known[2:] + unknown_field
    message = bytes([0x12, len(inner)]) + inner
    decoded = decode_request(message)
    assert isinstance(decoded, pb.WriteCacheRequest), "must not drop a field it cannot read"
    assert decoded.chunk.data == b"ab"
    assert decoded.SerializeToString() == message


def test_bytes_already_serialized_pass_through_the_client_serializer_untouched() -> None:
    message = encode_chunk_request(b"", [], 0)
    assert serialize_request(message) is message


@pytest.mark.parametrize(
    "message",
    [
        b"\x12\x05\x0a\x09ab",  # lengths field says 9 bytes, 2 follow
        b"\x12\xff",  # truncated length varint
        b"\x12\x02\x12",  # chunk shorter than it says
    ],
    ids=["overlong field", "truncated varint", "short chunk"],
)
def test_malformed_bytes_get_protobuf_s_decode_error(message: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_request(message)


@given(values_st, st.integers(0, 2**64 - 1))
def test_a_framed_read_shard_response_is_byte_for_byte_what_protobuf_serializes(
    values, start
) -> None:
    lengths = _lengths(values)
    views = [memoryview(v) for v in values]  # as the daemon frames them from LMDB's map
    framed = encode_read_shard_response(start, lengths, views)
    want = pb.ReadShardResponse(start=start, lengths=lengths, data=b"".join(values))
    assert framed == want.SerializeToString(deterministic=True)
    assert pb.ReadShardResponse.FromString(framed) == want
    assert read_shard_data_bytes(framed) == len(want.data)  # what the request log counts
