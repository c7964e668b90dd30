"""A mixed epoch's share as numbered chunks: one request per source per chunk, rows in order.

Chunk i is a run of positions of the mixed order (client/read/planning/mix.py). Its
(source, element) pairs are sorted by source and element, each source's
elements fetched in one request by that source's own CacheReads
(client/read/assembly/chunks.py: its lease, direct, data plane, gRPC or fleet), decoded,
and the rows scattered back to their positions: a chunk over 32 sources costs
32 smaller requests where a chunk of one cache costs one, the same bytes in
all. The sources' CacheReads open together when the epoch opens (their leases
asked on a few threads that end then); nothing else is kept per source (no
iterator, no thread), and the tf.data side is a cache's (client/tf/reads.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from client.format.codec import VarLeaf
from client.format.fixed_decode import aligned_empty
from client.read.assembly.chunks import CacheReads, joined
from client.read.planning import shares
from client.read.planning.mix import Mix, MixOrder
from client.read.planning.plan import ReadOptions, share_of
from client.read.planning.shares import Batching, Chunking
from client.wire.limits import MAX_INDICES

#: Threads that open the sources' reads (their leases) when an epoch opens; then they end.
OPENING_THREADS = 8
#: Opens source number s's CacheReads.
OpenSource = Callable[[int], CacheReads]


class MixChunks:
    """One mixed epoch's share, position start onwards, as count chunks (EpochChunks' API)."""

    def __init__(
        self,
        mix: Mix,
        options: ReadOptions,
        epoch: int,
        start: int,
        chunk_bytes: int,
        open_source: OpenSource,
        batches: shares.Batches | None = None,
    ) -> None:
        self._order = MixOrder(mix, options.mode, epoch)
        runs = shares.skip(share_of(mix, options, epoch), start)
        avg = mix.stored_bytes / mix.num_elements if mix.num_elements else 1.0
        self._per_chunk = int(min(max(chunk_bytes // max(avg, 1.0), 1), MAX_INDICES))
        self._open_source = open_source
        self._lock = threading.Lock()
        self._sources: dict[int, CacheReads] = {}
        self._closed = False
        self._chunks = (
            Chunking(runs, self._per_chunk) if batches is None else Batching(runs, batches)
        )
        self.count = self._chunks.count
        if self.count:  # each source's lease is a call to its daemon: ask them together
            wanted = [s for s, n in enumerate(mix.counts) if n]
            with ThreadPoolExecutor(min(OPENING_THREADS, len(wanted))) as pool:
                for s, reads in zip(wanted, pool.map(open_source, wanted)):
                    self._sources[s] = reads

    def _source(self, s: int) -> tuple[CacheReads, bool]:
        """Source s's reads, and whether this request starts its pass (counts its hit)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("shardcache: the mixed read is closed")
            reads = self._sources.get(s)
            if reads is None:
                reads = self._sources[s] = self._open_source(s)
            first, reads.epoch_start = reads.epoch_start, False
        return reads, first

    def chunk(self, i: int) -> tuple[int, list[Any]]:
        """(elements, decoded batch) of chunk i, rows in the mixed order."""
        positions = np.concatenate([np.arange(p0, p1) for p0, p1 in self._chunks.pieces(i)])
        source, element = self._order.pairs(positions)
        by_source = np.lexsort((element, source))  # rows as the requests give them
        sources, firsts = np.unique(source[by_source], return_index=True)
        ends = [*firsts[1:], len(by_source)]
        parts: list[tuple[np.ndarray, list[Any]]] = []
        for s, lo, hi in zip(sources, firsts, ends):
            reads, first = self._source(int(s))
            rows = by_source[lo:hi]
            _, batch = reads(element[rows], first)
            parts.append((rows, batch))
        n = len(positions)
        if len(parts) == 1:
            rows, batch = parts[0]
            return n, [_taken(column, np.argsort(rows)) for column in batch]
        return n, [
            _scattered([(rows, batch[k]) for rows, batch in parts], n)
            for k in range(len(parts[0][1]))
        ]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._sources = list(self._sources.values()), {}
        for reads in opened:
            reads.close()


def _scattered(parts: list[tuple[np.ndarray, Any]], n: int) -> Any:
    """One leaf's column of n rows: each part's rows put at their positions."""
    first = parts[0][1]
    if isinstance(first, VarLeaf):  # ragged: join, then gather rows
        rows = np.concatenate([rows for rows, _ in parts])
        return _taken(joined(tuple(column for _, column in parts)), np.argsort(rows))
    out = (
        np.empty((n, *first.shape[1:]), first.dtype)
        if first.dtype.hasobject
        else aligned_empty((n, *first.shape[1:]), first.dtype)
    )
    for rows, column in parts:
        out[rows] = column
    return out


def _taken(column: Any, order: np.ndarray) -> Any:
    """column's rows in order."""
    if not isinstance(column, VarLeaf):
        if column.dtype.hasobject:
            return column[order]
        out = aligned_empty((len(order), *column.shape[1:]), column.dtype)
        np.take(column, order, axis=0, out=out)
        return out
    return VarLeaf(
        *_rows(column.values, column.sizes, order), *_rows(column.dims, column.ranks, order)
    )


def _rows(
    flat: np.ndarray, lengths: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, lengths) of ragged rows taken in order."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    taken = lengths[order]
    ends = np.cumsum(taken)
    index = np.repeat(starts[order] - (ends - taken), taken) + np.arange(
        int(ends[-1]) if len(ends) else 0
    )
    return flat[index], taken
