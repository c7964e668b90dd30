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
from client.read.assembly.landing import landing
from client.read.fetching.direct import DirectReads
from client.read.fetching.factory import open_fetcher
from client.read.fetching.fetch import Closed, Indices, Landed, chunk_positions
from client.read.planning.order import EpochOrder
from client.read.planning.plan import ReadOptions, epoch_range
from client.read.planning.shares import Batches, Batching, Chunking
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
        buffers: Buffers | None = None,
    ) -> None:
        #: the chunks' arrays, reused (client/read/assembly/buffers.py): the read's, which
        #: every pass shares, so a later epoch writes into memory already faulted in
        self.buffers = buffers or Buffers()
        self._own_buffers = buffers is None
        self._fetch, counted = open_fetcher(
            transport,
            cache,
            options.reconnect_timeout,
            chunk_bytes,
            reading,
            direct,
            fleet,
            self.buffers.empty,
            pass_shards or [],
        )
        #: True until the request that starts the pass (the daemon counts its hit) is sent.
        self.epoch_start = not counted
        #: how the chunks come, for the read's report (client/observe/report.py)
        self.path = self._fetch.path
        self._layout = layout
        #: every leaf has a fixed shape: batches can be filled (batch_arrays, fill)
        self.fixed = all(leaf.fixed for leaf in layout.leaves)
        self._decode = Decoder(cache, layout, self.buffers.empty)

    def __call__(self, indices: Indices, epoch_start: bool = False) -> tuple[int, list[Any]]:
        """(elements, decoded batch) of the records at indices, in their order."""
        try:
            parts = [
                self._decode(request, chunk)
                for at, request in _requests(indices)
                for chunk in self._fetch.stream(request, epoch_start and not at)
            ]
        except Closed:
            raise
        except ShardcacheError as exc:
            self._fetch.failed(exc)
            raise
        return self.joined(parts)

    def joined(self, parts: list[tuple[int, list[Any]]]) -> tuple[int, list[Any]]:
        """(elements, decoded batch) of decoded parts in order, joined into the pass's arrays."""
        if len(parts) == 1:
            return parts[0]
        return sum(n for n, _ in parts), [
            joined(column, self.buffers.empty) for column in zip(*(batch for _, batch in parts))
        ]

    def batch_arrays(self, n: int) -> list[np.ndarray]:
        """Uninitialised arrays of n elements, one per leaf (a cache of fixed-shape leaves),
        for fill(): aligned, in the pass's reused maps, so TensorFlow adopts them as they are."""
        return [
            np.empty((n, *leaf.fixed_shape), object)
            if leaf.np_dtype.hasobject
            else self.buffers.empty((n, *leaf.fixed_shape), leaf.np_dtype)
            for leaf in self._layout.leaves
        ]

    def fill(
        self, indices: Indices, outs: list[np.ndarray], at: int, epoch_start: bool = False
    ) -> None:
        """Decode the records at indices into rows [at, at + len(indices)) of outs
        (batch_arrays'): each fetched chunk straight into its rows where the decoder can
        write there (one copy per byte), else decoded and copied in (a block cut by the
        request's ends, a leaf of strings). A data-plane chunk of raw records is received
        into its rows by the socket (assembly/landing.py) and only checked here."""
        try:
            for offset, request in _requests(indices):
                first = at + offset
                end = first + len(request)
                land = landing(self._decode.layout, outs, first, end)
                for chunk in self._fetch.stream(request, epoch_start and not offset, land):
                    if isinstance(chunk[2], Landed):
                        self._decode.landed(request, chunk[0], chunk[2])
                        continue
                    row = first + max(chunk[0], 0)  # the request's rows the chunk holds
                    n, batch = self._decode(request, chunk, _Rows(outs, row, end))
                    for out, column in zip(outs, batch):
                        target = out[row : row + n]
                        if column.dtype.hasobject or column.ctypes.data != target.ctypes.data:
                            target[...] = column
        except Closed:
            raise
        except ShardcacheError as exc:
            self._fetch.failed(exc)
            raise

    def close(self) -> None:
        self._fetch.close()
        if self._own_buffers:
            self.buffers.close()


def _requests(indices: Indices) -> list[tuple[int, Indices]]:
    """indices as the requests that ask for them, each with its offset: a run of the stored
    order in one, any other order in requests of at most MAX_INDICES."""
    if isinstance(indices, range) or len(indices) <= MAX_INDICES:
        return [(0, indices)]
    return [(lo, indices[lo : lo + MAX_INDICES]) for lo in range(0, len(indices), MAX_INDICES)]


class _Rows:
    """An Empty (codec.Empty) that hands the decoder rows of the batch it fills: its k-th
    array of a leaf's shape and dtype is leaf k's rows from row on, when they fit before
    end; any other array (scratch, a leaf that does not fit) is the pass's own."""

    def __init__(self, outs: list[np.ndarray], row: int, end: int) -> None:
        self._outs = outs
        self._row = row
        self._end = end
        self._leaf = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if self._leaf < len(self._outs):
            out = self._outs[self._leaf]
            if (
                shape[1:] == out.shape[1:]
                and dtype == out.dtype
                and not dtype.hasobject
                and self._row + shape[0] <= self._end
            ):
                self._leaf += 1
                return out[self._row : self._row + shape[0]]
        return aligned_empty(shape, dtype)


class EpochChunks:
    """One epoch's share of a cache, position start onwards, as count chunks.

    chunk(i) is thread-safe and depends on i alone; close() ends the lease and
    cancels calls in flight. direct: a read lease (client/read/fetching/direct.py) when it
    allows one, the shard files then read here. batches: the chunks are the consumer's
    batches themselves (shares.Batching), each decoded into arrays of its own
    (CacheReads.fill): one copy of every byte from the shard files (or the socket) to
    the batch. Without, chunks of about prefetch_bytes / 8 of stored records.
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
        batches: Batches | None = None,
        buffers: Buffers | None = None,
    ) -> None:
        self._order: EpochOrder
        self._order, runs = epoch_range(cache, options, epoch, start)
        per_element = cache.stored_bytes / max(cache.num_elements, 1)
        self._chunks: Chunking | Batching
        if batches is not None:
            self._chunks = Batching(runs, batches)
            per_chunk = batches.size
        else:
            per_chunk = chunk_positions(cache, chunk_target(prefetch_bytes))
            self._chunks = Chunking(runs, per_chunk)  # no chunk crosses two runs
        #: stored bytes of a chunk, about
        self.chunk_bytes = chunk_bytes = int(per_chunk * per_element)
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
            buffers,
        )
        self.count = self._chunks.count
        self.path = self._reads.path

    def chunk(self, i: int) -> tuple[int, list[Any]]:
        """(elements, decoded batch) of chunk i: its positions [p0, p1) of the epoch."""
        epoch_start = self._reads.epoch_start and i == 0
        if isinstance(self._chunks, Chunking):
            return self._reads(self._indices(*self._chunks.bounds(i)), epoch_start)
        pieces = self._chunks.pieces(i)
        requests: list[Indices] = (
            [range(p0, p1) for p0, p1 in pieces]  # one ascending run of the stored order each
            if self._order.mode == "none"
            else [self._order.run_indices(pieces)]
        )
        n = sum(len(request) for request in requests)
        if not self._reads.fixed:  # variable shapes: each request decoded, then joined
            return self._reads.joined(
                [self._reads(r, epoch_start and not k) for k, r in enumerate(requests)]
            )
        outs = self._reads.batch_arrays(n)
        at = 0
        for k, request in enumerate(requests):
            self._reads.fill(request, outs, at, epoch_start and not k)
            at += len(request)
        return n, outs

    def _indices(self, p0: int, p1: int) -> Indices:
        """The cache's indices at positions [p0, p1) of the epoch's order."""
        if self._order.mode == "none":  # the stored order
            return range(p0, p1)
        return self._order.run_indices([(p0, p1)])

    def close(self) -> None:
        self._reads.close()


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
