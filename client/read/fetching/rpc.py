"""GrpcFetcher: one daemon's records over ReadShard and ReadElements (a fetch.Remote).

A run of consecutive indices (the stored order, as every unshuffled read is) goes
over ReadShard with start/count, a cursor walk with read-ahead that costs less per
element; any other list (shuffled positions) over ReadElements.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

from client._transport import Transport, pb
from client.format.layout import Layout
from client.read.fetching.fetch import (
    Calls,
    Indices,
    Land,
    Piece,
    Request,
    Stateless,
    is_run,
    shard_runs,
)


class GrpcFetcher:
    """A Remote: one daemon's records over ReadShard and ReadElements."""

    path = "grpc"
    lost_level = logging.WARNING

    def __init__(
        self, transport: Transport, cache: pb.Cache, calls: Calls, chunk_bytes: int
    ) -> None:
        self._transport = transport
        self.cache = cache
        self._calls = calls
        self.k = Layout.from_json(cache.layout_json).block_elements
        self.chunk_bytes = chunk_bytes  # asked of the daemon per message
        self.target = transport.target

    def request(self) -> Request:
        return Stateless(self.attempt)

    def failed(self) -> None:
        pass

    def close(self) -> None:
        pass

    def attempt(
        self, indices: Indices, epoch_start: bool, land: Land | None = None
    ) -> Iterator[Piece]:
        """One try at indices: (position in indices, elements, lengths, data) chunks, in order.

        A run of consecutive indices (stored order: every unshuffled read) goes
        over ReadShard, a cursor walk with read-ahead, in whole blocks: a chunk
        may start before the first index (negative position) and end after the
        last; Decoder trims. Any other list goes over ReadElements, one key
        lookup per record, one element per value. land: unused (a message's bytes are
        gRPC's).
        """
        first = int(indices[0])
        stub, cache = self._transport.stub, self.cache
        if not is_run(indices):
            yield from self._calls.stream(
                stub.ReadElements(
                    pb.ReadElementsRequest(
                        name=cache.name,
                        fingerprint=cache.fingerprint,
                        indices=np.asarray(indices, "<u8").tobytes(),
                        chunk_bytes=self.chunk_bytes,
                        epoch_start=epoch_start,
                    )
                ),
                0,
                "position",
                self.k,
                None,
            )
            return
        for shard, start, count in shard_runs(cache, first, first + len(indices)):
            call = stub.ReadShard(
                pb.ReadShardRequest(
                    name=cache.name,
                    shard=shard.index,
                    start=start,
                    count=count,
                    chunk_bytes=self.chunk_bytes,
                    fingerprint=cache.fingerprint,
                    epoch_start=epoch_start,
                )
            )
            epoch_start = False
            yield from self._calls.stream(
                call, shard.first_element - first, "start", self.k, shard.num_elements
            )
