"""Write a cache of several shards through the real WriteCache RPC.

cc.cache() lets the daemon pick the shard size (1 GiB), so small test caches
have one shard; reads across shard boundaries need several. This writes like
cc.cache()'s first epoch, with WriteBegin.shard_bytes and a small chunk size:
one element per stored value (format 1, as earlier versions wrote), or, with
block_bytes, blocks of about that many raw bytes (format 2). ids() reads back the
tests' tagged elements ({"x": i repeated, "i": i}), checking each record is its element.
write_tiny_shards() writes many shards fast, without TensorFlow: one chunk of a few int64
scalars (0, 1, 2, ...) per shard.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from client import CacheClient
from client._transport import pb
from client.format import spec as specs
from client.format.blocks import BlockPacker, blocked
from client.format.layout import Layout, Leaf
from client.format.values import Compressor
from client.write.stream import CacheWriter


def write_sharded(
    cc: CacheClient,
    ds: Any,
    name: str,
    shard_bytes: int,
    chunk_bytes: int = 4096,
    version: str | None = None,
    block_bytes: int | None = None,
    batch_elements: int = 64,
) -> pb.Cache:
    from client.tf import convert

    spec = ds.element_spec
    layout = convert.layout_of(spec)
    if block_bytes is not None:
        layout = blocked(layout, block_bytes)
    fmt = convert.BatchFormat(spec, layout)
    begin = pb.WriteBegin(
        name=name,
        fingerprint=f"version:{version or name}",
        layout_json=layout.to_json(),
        element_spec=convert.encode_spec(spec),
        shard_bytes=shard_bytes,
    )
    writer = CacheWriter(cc._transport, begin, chunk_bytes=chunk_bytes)
    assert writer.begin().decision == pb.WRITE_DECISION_ACCEPTED
    packer = BlockPacker(layout, None if block_bytes else Compressor())
    for n, batch in convert.source_batches(ds, fmt, batch_elements):  # a shard ends between two
        writer.add(*packer.add(batch, n))
    writer.add(*packer.flush())
    return writer.finish()


def write_tiny_shards(cc: CacheClient, name: str, shards: int, per_shard: int = 4) -> pb.Cache:
    """Cache name of shards shards of per_shard int64 scalars each, element i being i, through
    the real WriteCache RPC: shard_bytes 1 ends a shard at every chunk, one chunk a shard."""
    leaf = Leaf("int64", ())
    layout = Layout((leaf,))
    begin = pb.WriteBegin(
        name=name,
        fingerprint=f"version:{name}",
        layout_json=layout.to_json(),
        element_spec=specs.encode(leaf),
        shard_bytes=1,
    )
    writer = CacheWriter(cc._transport, begin, chunk_bytes=1)
    decision = writer.begin().decision
    if decision != pb.WRITE_DECISION_ACCEPTED:
        writer.abort()
        raise RuntimeError(f"cache {name!r}: the daemon answered {decision}, not ACCEPTED")
    packer = BlockPacker(layout, Compressor())
    try:
        for s in range(shards):
            elements = np.arange(s * per_shard, (s + 1) * per_shard, dtype=np.int64)
            writer.add(*packer.add([elements], per_shard))
        cache = writer.finish()
    except BaseException:
        writer.abort()
        raise
    assert len(cache.shards) == shards, f"{len(cache.shards)} shards, not {shards}"
    return cache


def ids(ds: Any) -> list[int]:
    """The "i" of each element of ds, each checked to carry its own record ("x" == i)."""
    out = []
    for element in ds.as_numpy_iterator():
        assert (element["x"] == element["i"]).all()  # the record is the element asked for
        out.append(int(element["i"]))
    return out
