"""Chunks on the wire without protobuf's copies of the data: WriteCache and ReadShard.

A WriteChunk carries ~1 MiB of records. Through the generated classes each
byte is copied five times on its way: joined into one bytes object, copied
into the message, serialized; on the daemon parsed into a message and copied
out again by every access of ``chunk.data`` (docs/writing.md counts them).
These functions frame and read the same protobuf encoding directly:

* :func:`encode_chunk_request` writes the serialized WriteCacheRequest with
  one ``join`` of the records (the bytes ``SerializeToString`` would give);
* :func:`decode_request` gives the daemon a :class:`ChunkView` whose ``data``
  is a memoryview into the received message, and falls back to protobuf for
  anything else: a begin or finish, any field this module does not know (a
  newer client), or bytes it cannot frame (protobuf then reports the error).

The WriteCache stream uses them as its (de)serializers on both sides; the
stored values are what client/format/values.py made of them, untouched.

ReadShard's responses go the other way: :func:`encode_read_shard_response`
lets the daemon frame a chunk straight from the values' views into LMDB's map
(one copy; the join, the message's copy of it and the serialization were
three), and the client parses it with the generated class as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from client.wire.limits import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from client.wire.v1 import cache_service_pb2 as pb


def chunk_size(requested: int) -> int:
    """Bytes per chunk for a request's chunk_bytes: 0 is the default; 4 KiB to 16 MiB."""
    return min(max(requested or DEFAULT_CHUNK_BYTES, MIN_CHUNK_BYTES), MAX_CHUNK_BYTES)


_LEN, _VARINT = 2, 0
#: Field numbers: WriteCacheRequest.chunk; WriteChunk.lengths, .data, .raw_bytes.
_CHUNK, _LENGTHS, _DATA, _RAW_BYTES = 2, 1, 2, 3
_CHUNK_TAG = bytes([_CHUNK << 3 | _LEN])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def encode_chunk_request(
    lengths: bytes, values: Sequence[bytes | memoryview], raw_bytes: int
) -> bytes:
    """Serialized WriteCacheRequest(chunk=WriteChunk(lengths, b"".join(values), raw_bytes))."""
    data_len = sum(len(v) for v in values)
    head = b""
    if lengths:
        head = _key(_LENGTHS, _LEN) + _varint(len(lengths)) + lengths
    if data_len:
        head += _key(_DATA, _LEN) + _varint(data_len)
    tail = _key(_RAW_BYTES, _VARINT) + _varint(raw_bytes) if raw_bytes else b""
    inner_len = len(head) + data_len + len(tail)
    return b"".join([_CHUNK_TAG, _varint(inner_len), head, *values, tail])


def serialize_request(request: pb.WriteCacheRequest | bytes) -> bytes:
    """The client's request serializer: bytes from encode_chunk_request pass as they are.

    Also the daemon's ReadShard response serializer, for encode_read_shard_response's bytes.
    """
    if isinstance(request, bytes):
        return request
    return request.SerializeToString()  # type: ignore[no-any-return]


#: Field numbers of ReadShardResponse: start, lengths, data.
_START, _READ_LENGTHS, _READ_DATA = 1, 2, 3


def encode_read_shard_response(
    start: int, lengths: bytes, values: Sequence[bytes | memoryview]
) -> bytes:
    """Serialized ReadShardResponse(start, lengths, b"".join(values)), with one join."""
    data_len = sum(len(v) for v in values)
    head = _key(_START, _VARINT) + _varint(start) if start else b""
    if lengths:
        head += _key(_READ_LENGTHS, _LEN) + _varint(len(lengths)) + lengths
    if data_len:
        head += _key(_READ_DATA, _LEN) + _varint(data_len)
    return b"".join([head, *values])


def read_shard_data_bytes(message: bytes) -> int:
    """The length of the data field of an encode_read_shard_response message."""
    buf, pos = memoryview(message), 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos, len(buf))
        if key & 7 == _VARINT:
            _, pos = _read_varint(buf, pos, len(buf))
            continue
        size, pos = _read_varint(buf, pos, len(buf))
        if key >> 3 == _READ_DATA:
            return size
        pos += size
    return 0


class ChunkView:
    """A received WriteCacheRequest holding a chunk; chunk.data is a view, not a copy.

    Answers what the daemon asks of a WriteCacheRequest: WhichOneof("request"),
    chunk.lengths / .data / .raw_bytes, DESCRIPTOR.
    """

    DESCRIPTOR = pb.WriteCacheRequest.DESCRIPTOR
    __slots__ = ("data", "lengths", "raw_bytes")

    def __init__(self, lengths: bytes, data: memoryview, raw_bytes: int) -> None:
        self.lengths = lengths
        self.data = data
        self.raw_bytes = raw_bytes

    @property
    def chunk(self) -> ChunkView:
        return self

    def WhichOneof(self, group: str) -> str | None:
        return "chunk" if group == "request" else None


class _Unframed(Exception):
    """Not a plain chunk this module reads: protobuf decides."""


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unframed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _chunk_view(message: bytes) -> ChunkView:
    buf = memoryview(message)
    if not message.startswith(_CHUNK_TAG):
        raise _Unframed
    inner_len, pos = _read_varint(buf, 1, len(buf))
    end = pos + inner_len
    if end != len(buf):
        raise _Unframed  # more than one top-level field (or truncated)
    fields: dict[int, Any] = {}
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        if field in fields or field not in (_LENGTHS, _DATA, _RAW_BYTES):
            raise _Unframed
        if wire_type == _LEN and field != _RAW_BYTES:
            size, pos = _read_varint(buf, pos, end)
            if pos + size > end:
                raise _Unframed
            fields[field] = buf[pos : pos + size]
            pos += size
        elif wire_type == _VARINT and field == _RAW_BYTES:
            fields[field], pos = _read_varint(buf, pos, end)
        else:
            raise _Unframed
    return ChunkView(
        bytes(fields.get(_LENGTHS, b"")),
        fields.get(_DATA, memoryview(b"")),
        fields.get(_RAW_BYTES, 0),
    )


def decode_request(message: bytes) -> pb.WriteCacheRequest | ChunkView:
    """The daemon's request deserializer for WriteCache."""
    try:
        return _chunk_view(message)
    except _Unframed:
        return pb.WriteCacheRequest.FromString(message)
