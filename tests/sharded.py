"""Write a cache of several shards through the real WriteCache RPC.

cc.cache() lets the daemon pick the shard size (1 GiB), so small test caches
have one shard; reads across shard boundaries need several. This writes like
cc.cache()'s first epoch, with WriteBegin.shard_bytes and a small chunk size.
"""

from __future__ import annotations

from typing import Any

from client import CacheClient
from client._transport import pb
from client._writer import CacheWriter
from client.codec import Compressor, encode_batch


def write_sharded(cc: CacheClient, ds: Any, name: str, shard_bytes: int,
                  chunk_bytes: int = 4096, version: str | None = None) -> pb.Cache:
    from client import _tf

    spec = ds.element_spec
    layout = _tf.layout_of(spec)
    wire = _tf.WireFormat(spec, layout)
    begin = pb.WriteBegin(name=name, fingerprint=f"version:{version or name}",
                          layout_json=layout.to_json(), element_spec=_tf.encode_spec(spec),
                          shard_bytes=shard_bytes)
    writer = CacheWriter(cc._transport, begin, chunk_bytes=chunk_bytes)
    assert writer.begin().decision == pb.WRITE_DECISION_ACCEPTED
    compressor = Compressor()
    for n, batch in _tf.source_batches(ds, wire, 64):
        bodies = encode_batch(layout, batch, n)
        raw = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in bodies)
        writer.add([compressor.pack(b) for b in bodies], raw)
    return writer.finish()
