"""A same-host pass over a partially resident cache: its resident shards read from their
files, its streamed ones from the daemon's stream window's files, or through the daemon.

A daemon whose room is smaller than a cache pulled from the object store keeps only some
of its shards on disk and streams the others from the store for each pass
(docs/operations.md, "Caches larger than the room"). The read lease names the streamed
ones (AcquireReadLeaseResponse.streamed_shards); this fetcher sends each request's runs
of indices in resident shards to the leased files (client/read/fetching/direct.py), and
each run in a streamed shard to the files of that shard's window slot, held while the
run reads them (client/read/fetching/held.py), or, when it cannot be held, to the daemon
(its data plane or gRPC, reconnecting); it gives back their chunks in the request's
order. A request that switches between resident and streamed shards more than a few times
(an exact global shuffle touches most shards in every request) goes to the daemon whole:
it reads resident shards from its own disk as fast, in one call, and holds a streamed
shard for one request at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from client.errors import ShardcacheError
from client.read.fetching.direct import LocalFetcher
from client.read.fetching.fetch import Chunk, Fetcher, Indices, Land, shifted

#: A request split into more runs than this goes to the daemon whole.
MAX_RUNS = 8


class PartialFetcher:
    """One pass's fetcher of a partially resident cache: files here, the rest remote."""

    path = "direct"

    def __init__(self, local: LocalFetcher, remote: Fetcher, streamed: set[int]) -> None:
        self._local, self._remote = local, remote
        cache = local.lease.cache
        self._firsts = np.array([s.first_element for s in cache.shards], np.uint64)
        self._streamed = np.zeros(len(cache.shards), bool)
        self._streamed[sorted(streamed)] = True

    def _runs(self, indices: Indices) -> list[tuple[int, int, bool]]:
        """(start, stop, streamed) of the request's runs of positions, in order."""
        at = np.asarray(indices, np.uint64)
        shard = np.searchsorted(self._firsts, at, side="right") - 1
        remote = self._streamed[shard]
        cuts = np.flatnonzero(remote[1:] != remote[:-1]) + 1
        starts = [0, *cuts.tolist()]
        stops = [*cuts.tolist(), len(at)]
        return [(a, b, bool(remote[a])) for a, b in zip(starts, stops)]

    def stream(
        self, indices: Indices, epoch_start: bool = False, land: Land | None = None
    ) -> Iterator[Chunk]:
        if not len(indices):
            return
        runs = self._runs(indices)
        whole = len(runs) > MAX_RUNS
        if whole:
            runs = [(0, len(indices), True)]
        for start, stop, remote in runs:
            part = indices[start:stop]
            if remote and not whole and self._local.window_holds is not None:
                yield from self._from_window(part, start, epoch_start, land)
            else:
                fetcher: Fetcher = self._remote if remote else self._local
                for position, lengths, data in fetcher.stream(
                    part, epoch_start, shifted(land, start)
                ):
                    yield start + position, lengths, data
            epoch_start = False

    def _from_window(
        self, part: Indices, start: int, epoch_start: bool, land: Land | None
    ) -> Iterator[Chunk]:
        """A run of positions in streamed shards, request positions from start: each shard's
        piece from its window slot's files, or through the daemon where it cannot be held."""
        at = np.asarray(part, np.uint64)
        shard = np.searchsorted(self._firsts, at, side="right") - 1
        cuts = (np.flatnonzero(shard[1:] != shard[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(at)]):
            piece, offset = part[a:b], start + a
            with self._local.streamed_run(int(shard[a]), piece) as chunks:
                source = (
                    chunks
                    if chunks is not None
                    else self._remote.stream(piece, epoch_start, shifted(land, offset))
                )
                for position, lengths, data in source:
                    yield offset + position, lengths, data
            epoch_start = False

    def failed(self, cause: ShardcacheError) -> None:
        self._local.failed(cause)
        self._remote.failed(cause)

    def close(self) -> None:
        try:
            self._remote.close()
        finally:
            self._local.close()
