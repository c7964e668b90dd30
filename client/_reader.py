"""Streams a READY cache's shards into decoded batches with bounded prefetch.

One producer thread pulls ~1 MiB chunks from ReadShard streams; a small thread
pool decompresses and decodes them (zstd and CRC-32 release the GIL); futures
wait in a queue bounded by the decoded bytes they will occupy, in stream order.
Closing (early stop) cancels the stream, unblocks the producer and joins it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc

from client._prefetch import Closed, Prefetcher
from client._transport import Transport, pb
from client.codec import Decompressor, Layout, RecordError, decode_batch, split_chunk
from client.errors import DataLossError, from_rpc_error

DEFAULT_PREFETCH_BYTES = 256 << 20
DEFAULT_CHUNK_BYTES = 1 << 20


class _Decoder:
    """Decodes chunks of one cache; thread-safe (one Decompressor per thread)."""

    def __init__(self, name: str, layout: Layout) -> None:
        self._name = name
        self._layout = layout
        self._local = threading.local()

    def __call__(self, shard: int, chunk: pb.ReadShardResponse) -> tuple[int, list[Any]]:
        dec = getattr(self._local, "dec", None)
        if dec is None:
            dec = self._local.dec = Decompressor()
        where = f"chunk at record {chunk.start}"
        try:
            values = split_chunk(chunk.lengths, chunk.data)
            bodies = []
            for i, value in enumerate(values):
                where = f"record {chunk.start + i}"
                bodies.append(dec.unpack(value))
            where = f"records {chunk.start}-{chunk.start + len(bodies) - 1}"
            return len(bodies), decode_batch(self._layout, bodies)
        except RecordError as exc:
            raise DataLossError(f"cache {self._name!r} shard {shard} {where} is corrupt: "
                                f"{exc}; delete the cache and build it again") from exc


def read_batches(transport: Transport, cache: pb.Cache, layout: Layout, *,
                 prefetch_bytes: int = DEFAULT_PREFETCH_BYTES, decode_threads: int = 2,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, list[Any]]]:
    """Yield the cache's elements as (count, decoded batch), one per chunk, in order."""
    transport.connect()
    decode = _Decoder(cache.name, layout)
    expansion = cache.raw_bytes / cache.stored_bytes if cache.stored_bytes else 1.0
    pool = ThreadPoolExecutor(decode_threads, thread_name_prefix="shardcache-decode")
    current: list[grpc.Call] = []
    closing = threading.Event()

    def produce(put: Callable[[Future[tuple[int, list[Any]]], int], None]) -> None:
        for shard in cache.shards:
            if shard.num_elements == 0:
                continue
            request = pb.ReadShardRequest(name=cache.name, shard=shard.index, start=0,
                                          chunk_bytes=chunk_bytes,
                                          fingerprint=cache.fingerprint)
            call = transport.stub.ReadShard(request)
            current[:] = [call]
            if closing.is_set():
                call.cancel()
            try:
                for chunk in call:
                    put(pool.submit(decode, shard.index, chunk), int(len(chunk.data) * expansion))
            except grpc.RpcError as err:
                if closing.is_set():
                    raise Closed() from err
                raise from_rpc_error(err, transport.target) from err

    def cancel() -> None:
        closing.set()
        for call in current:
            call.cancel()

    prefetcher = Prefetcher(produce, prefetch_bytes, on_close=cancel)
    try:
        for future in prefetcher:
            yield future.result()
    finally:
        for future in prefetcher.close():
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
