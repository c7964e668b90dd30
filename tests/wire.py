"""Writing and reading caches over the raw wire protocol (no TensorFlow), for ops tests."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import grpc

from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

#: The layout of opaque records: no leaves. The daemon checks a write's layout but never
#: decodes its records.
LAYOUT = '{"format": 1, "leaves": []}'


def stub(channel: grpc.Channel) -> pb_grpc.CacheServiceStub:
    return pb_grpc.CacheServiceStub(channel)


def records(n: int, size: int, seed: int = 0) -> list[bytes]:
    """n distinct records of size bytes (random, so nothing compresses them away)."""
    return [struct.pack("<II", seed, i) + os.urandom(size - 8) for i in range(n)]


def write_requests(
    name: str, values: list[bytes], per_chunk: int = 4
) -> Iterator[pb.WriteCacheRequest]:
    yield pb.WriteCacheRequest(
        begin=pb.WriteBegin(name=name, fingerprint=f"fp-{name}", layout_json=LAYOUT)
    )
    for i in range(0, len(values), per_chunk):
        part = values[i : i + per_chunk]
        yield pb.WriteCacheRequest(
            chunk=pb.WriteChunk(
                lengths=struct.pack(f"<{len(part)}I", *map(len, part)),
                data=b"".join(part),
                raw_bytes=sum(map(len, part)),
            )
        )
    yield pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=len(values)))


def write_cache(
    channel: grpc.Channel,
    name: str,
    values: list[bytes],
    metadata: tuple[tuple[str, str], ...] = (),
) -> pb.Cache:
    """Write a whole cache; returns the committed Cache, raises grpc.RpcError."""
    responses = list(
        stub(channel).WriteCache(write_requests(name, values), metadata=metadata, timeout=60)
    )
    assert responses[0].begun.decision == pb.WRITE_DECISION_ACCEPTED, responses[0]
    return responses[-1].committed


def read_all(channel: grpc.Channel, name: str) -> list[bytes]:
    """Every record of cache name, shard by shard."""
    cache = stub(channel).GetCache(pb.GetCacheRequest(name=name), timeout=10).cache
    out: list[bytes] = []
    for shard in cache.shards:
        for chunk in stub(channel).ReadShard(
            pb.ReadShardRequest(name=name, shard=shard.index), timeout=60
        ):
            out.extend(split(chunk))
    return out


def split(chunk: pb.ReadShardResponse) -> list[bytes]:
    lengths = struct.unpack(f"<{len(chunk.lengths) // 4}I", chunk.lengths)
    out, offset = [], 0
    for n in lengths:
        out.append(chunk.data[offset : offset + n])
        offset += n
    return out


def reason(err: grpc.RpcError) -> str:
    return dict(err.trailing_metadata() or ()).get("shardcache-reason", "")


def names(channel: grpc.Channel) -> list[str]:
    return sorted(
        c.name for c in stub(channel).ListCaches(pb.ListCachesRequest(), timeout=10).caches
    )
