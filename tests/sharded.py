"""Write a cache of several shards through the real WriteCache RPC.

cc.cache() lets the daemon pick the shard size (1 GiB), so small test caches
have one shard; reads across shard boundaries need several. This writes like
cc.cache()'s first epoch, with WriteBegin.shard_bytes and a small chunk size:
one element per stored value (format 1, as earlier versions wrote), or, with
block_bytes, blocks of about that many raw bytes (format 2). ids() reads back the
tests' tagged elements ({"x": i repeated, "i": i}), checking each record is its element.
"""

from __future__ import annotations

from typing import Any

from client import CacheClient
from client._transport import pb
from client.format.blocks import BlockPacker, blocked
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


def ids(ds: Any) -> list[int]:
    """The "i" of each element of ds, each checked to carry its own record ("x" == i)."""
    out = []
    for element in ds.as_numpy_iterator():
        assert (element["x"] == element["i"]).all()  # the record is the element asked for
        out.append(int(element["i"]))
    return out
