"""An epoch's share as numbered chunks, each fetched and decoded on its own: parallel reads.

The epoch is cut into chunks of consecutive positions, and
:meth:`EpochChunks.chunk` returns chunk i's decoded batch, a function of i
alone: TensorFlow's own threads call it, several at once
(``range(count).map(chunk, num_parallel_calls=AUTOTUNE, deterministic=True)``,
client/tf/reads.py), and tf.data's prefetch and autotuning keep chunks in
flight. A chunk's work (LMDB reads or one gRPC call, CRC, zstd, the copy into
aligned arrays) releases the GIL for most of its time.

Each chunk is one request: ReadShard for a run of the stored order, ReadElements
for shuffled positions (client/read/fetching/fetch.py), the same requests on the daemon's
data plane when it has one (client/read/fetching/plane.py), the same calls to each shard's
owner in a fleet (client/read/fetching/fleet.py), or the same reads of the leased
shard files (client/read/fetching/direct.py), asked for in one chunk of the request's
size, so a chunk is decoded (client/read/assembly/decode.py) with one copy into its
arrays. Reconnecting is the fetcher's: a chunk whose call fails with UNAVAILABLE
is asked again until ``reconnect_timeout`` passes without progress. Memory:
tf.data holds at most its parallelism's chunks in flight plus what the
consumer's prefetch keeps, each about ``chunk_bytes`` of stored records; the
pass reuses their arrays once TensorFlow lets go of them (client/read/assembly/buffers.py),
so what it holds does not grow with the data read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from client._fleet import Fleet
from client._transport import Transport, pb
from client.errors import ShardcacheError
from client.format.codec import VarLeaf
from client.format.fixed_decode import aligned_empty
from client.format.layout import Layout
from client.read.assembly.buffers import Buffers
from client.read.assembly.decode import Decoder
from client.read.fetching.direct import DirectReads
from client.read.fetching.factory import open_fetcher
from client.read.fetching.fetch import Closed, Indices, chunk_positions
from client.read.planning.order import EpochOrder
from client.read.planning.plan import ReadOptions, epoch_range
from client.read.planning.shares import Chunking
from client.wire.limits import MAX_INDICES

#: Stored bytes per chunk: large enough that a call's fixed cost is small against
#: its bytes, small enough that a few chunks in flight stay well under prefetch_bytes.
CHUNK_BYTES = 4 << 20


class CacheReads:
    """One cache's records by global index, fetched and decoded: a read lease (direct or the
    data plane) when one is granted, else gRPC or a fleet's owners. Thread-safe; close()
    ends the lease and cancels calls in flight."""

    def __init__(
        self,
        transport: Transport,
        cache: pb.Cache,
        layout: Layout,
        options: ReadOptions,
        chunk_bytes: int,
        reading: bool = True,
        direct: DirectReads | None = None,
        fleet: Fleet | None = None,
        pass_shards: list[int] | None = None,
    ) -> None:
        self._fetch, counted = open_fetcher(
            transport,
            cache,
            options.reconnect_timeout,
            chunk_bytes,
            reading,
            direct,
            fleet,
            pass_shards or [],
        )
        #: True until the request that starts the pass (the daemon counts its hit) is sent.
        self.epoch_start = not counted
        #: how the chunks come, for the read's report (client/observe/report.py)
        self.path = self._fetch.path
        self.buffers = Buffers()  # the chunks' arrays, reused (client/read/assembly/buffers.py)
        self._decode = Decoder(cache, layout, self.buffers.empty)

    def __call__(self, indices: Indices, epoch_start: bool = False) -> tuple[int, list[Any]]:
        """(elements, decoded batch) of the records at indices, in their order."""
        try:
            parts = [
                self._decode(indices, chunk) for chunk in self._fetch.stream(indices, epoch_start)
            ]
        except Closed:
            raise
        except ShardcacheError as exc:
            self._fetch.failed(exc)
            raise
        if len(parts) == 1:
            return parts[0]
        return sum(n for n, _ in parts), [
            joined(column, self.buffers.empty) for column in zip(*(batch for _, batch in parts))
        ]

    def close(self) -> None:
        self._fetch.close()
        self.buffers.close()


class EpochChunks:
    """One epoch's share of a cache, position start onwards, as count chunks.

    chunk(i) is thread-safe and depends on i alone; close() ends the lease and
    cancels calls in flight. direct: a read lease (client/read/fetching/direct.py) when it
    allows one, the shard files then read here. batch: the consumer cuts batches of this
    many elements from the start: chunks hold whole batches where they can (see
    batch_positions), so that a batch is a slice of one chunk's arrays, not a copy
    joined from several.
    """

    def __init__(
        self,
        transport: Transport,
        cache: pb.Cache,
        layout: Layout,
        options: ReadOptions,
        epoch: int,
        start: int,
        prefetch_bytes: int,
        direct: DirectReads | None = None,
        fleet: Fleet | None = None,
        batch: int = 1,
    ) -> None:
        self._order: EpochOrder
        self._order, runs = epoch_range(cache, options, epoch, start)
        self._per_chunk = batch_positions(
            chunk_positions(cache, chunk_target(prefetch_bytes)),
            batch,
            Layout.from_json(cache.layout_json).block_elements,
        )
        #: stored bytes of a chunk, about
        self.chunk_bytes = chunk_bytes = int(
            self._per_chunk * cache.stored_bytes / max(cache.num_elements, 1)
        )
        self._reads = CacheReads(
            transport,
            cache,
            layout,
            options,
            chunk_bytes,
            bool(runs),
            direct,
            fleet,
            self._order.shards(runs),  # a daemon streaming some fetches them ahead
        )
        self._chunks = Chunking(runs, self._per_chunk)  # no chunk crosses two runs
        self.count = self._chunks.count
        self.path = self._reads.path

    def chunk(self, i: int) -> tuple[int, list[Any]]:
        """(elements, decoded batch) of chunk i: its positions [p0, p1) of the epoch."""
        p0, p1 = self._chunks.bounds(i)
        indices: Indices = (
            range(p0, p1)
            if self._order.mode == "none"  # the stored order
            else self._order.indices(np.arange(p0, p1))
        )
        return self._reads(indices, self._reads.epoch_start and i == 0)

    def close(self) -> None:
        self._reads.close()


def batch_positions(per_chunk: int, batch: int, k: int) -> int:
    """Positions per chunk for a consumer of batches of batch elements: per_chunk rounded to
    whole batches, at least one (a batch of 64 602 KB images was cut from 11 chunks of ~4
    MiB and joined: a second copy of every byte). Caches in blocks (k > 1) keep chunks of
    whole blocks when those hold a batch or more: a batch then spans two chunks at most
    once per chunk."""
    if batch <= 1 or batch > MAX_INDICES or (k > 1 and per_chunk >= batch):
        return per_chunk
    return max(1, round(per_chunk / batch)) * batch


def chunk_target(prefetch_bytes: int) -> int:
    """Stored bytes per chunk for a read of prefetch_bytes."""
    return min(CHUNK_BYTES, max(prefetch_bytes // 8, 64 << 10))


def joined(parts: tuple[Any, ...], empty: Callable[..., np.ndarray] = aligned_empty) -> Any:
    """One leaf's batch from the batches of a chunk's parts (a chunk crossing a shard), in
    an array from empty (aligned_empty, or a pass's Buffers.empty)."""
    if isinstance(parts[0], VarLeaf):
        return VarLeaf(
            *(
                np.concatenate([getattr(p, f) for p in parts])
                for f in ("values", "sizes", "dims", "ranks")
            )
        )
    if parts[0].dtype.hasobject:  # strings: no buffer for TensorFlow to alias anyway
        return np.concatenate(parts)
    out = empty((sum(len(p) for p in parts), *parts[0].shape[1:]), parts[0].dtype)
    np.concatenate(parts, out=out)
    return out
