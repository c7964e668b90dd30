"""Fetchers of records by global index over gRPC: requests, reconnect, shard runs.

A run of consecutive indices (the stored order, as every unshuffled read is)
goes over ReadShard with start/count, a cursor walk with read-ahead that costs
less per element; any other list (shuffled positions) over ReadElements.

A request whose stream fails with UNAVAILABLE (daemon restarted, connection
dropped) is sent again for the indices not yet received, with exponential
backoff, until ``reconnect_timeout`` seconds pass without progress; the
fingerprint travels with every request, so a cache replaced meanwhile fails
with FingerprintMismatchError instead of mixing data. Everything received is
delivered, so the next undelivered index is the next one not received.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

from client._transport import Transport, pb
from client.errors import ReconnectTimeoutError, ServerUnavailableError, from_rpc_error
from client.format.layout import Layout
from client.wire.limits import MAX_INDICES

log = logging.getLogger("client")
CHUNK_BYTES = 1 << 20
_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 2.0

#: (position in the request, u32 lengths, data); a direct read of a layout decode_into
#: handles passes data as the values' memoryviews into the shard's map instead.
Chunk = tuple[int, bytes, Any]
#: A fleet read's calls asked ahead and not read when its try failed, by (member, shard,
#: start, count): the next try reads them (client/read/fleet_calls.py).
Ahead = dict[tuple[str, int, int, int], Any]
Indices = np.ndarray | range  # global element indices; a range is the stored order


class Closed(Exception):
    """Raised in a fetch, or a call it waits on, when its read has been closed."""


def chunk_positions(cache: pb.Cache, stored_bytes: int) -> int:
    """Positions per chunk of about stored_bytes of records, whole blocks of a blocked cache."""
    avg = cache.stored_bytes / cache.num_elements if cache.num_elements else 1.0
    k = Layout.from_json(cache.layout_json).block_elements
    n = int(min(max(stored_bytes // max(avg, 1.0), 1), MAX_INDICES))
    return max(n // k * k, k) if k > 1 else n


def is_run(indices: Indices) -> bool:
    """True for consecutive indices (the stored order, a worker's share), read as a run."""
    if not isinstance(indices, np.ndarray) or len(indices) < 2:
        return True
    return bool(np.all(np.diff(indices) == 1))


def shard_runs(cache: pb.Cache, first: int, stop: int) -> Iterator[tuple[Any, int, int]]:
    """(shard, shard-local start, count) of each shard holding global indices [first, stop)."""
    for shard in cache.shards:
        end = shard.first_element + shard.num_elements
        if end > first and shard.first_element < stop:
            start = max(first, shard.first_element)
            yield shard, start - shard.first_element, min(stop, end) - start


class Fetcher:
    """Fetches records by index, whole or as they arrive, reconnecting on UNAVAILABLE;
    thread-safe."""

    def __init__(self, transport: Transport, cache: pb.Cache, reconnect_timeout: float,
                 closing: threading.Event) -> None:
        self._transport = transport
        self._cache = cache
        self._k = Layout.from_json(cache.layout_json).block_elements
        self._timeout = reconnect_timeout
        self._closing = closing
        self._lock = threading.Lock()
        self._calls: set[Any] = set()
        self.chunk_bytes = CHUNK_BYTES  # asked of the daemon per message
        self.target = transport.target  # for messages
        self.lost_level = logging.WARNING  # of the message that the daemon was lost

    def cancel(self) -> None:
        self._closing.set()
        with self._lock:
            for call in self._calls:
                call.cancel()

    def __call__(self, indices: Indices, epoch_start: bool = False) -> list[Chunk]:
        """The records at indices, whole; epoch_start: this request starts a pass."""
        return list(self.stream(indices, epoch_start))

    def stream(self, indices: Indices, epoch_start: bool = False) -> Iterator[Chunk]:
        """The records at indices as chunks arrive, reconnecting on UNAVAILABLE.

        indices is an array of global indices, or a range (the stored order,
        never materialized). epoch_start: this request starts a pass (the daemon
        counts a hit, once).
        """
        got = 0
        failing_since: float | None = None
        delay = _FIRST_BACKOFF
        ahead: Ahead = {}  # calls a failed try sent ahead, for the next try (FleetFetcher)
        try:
            while got < len(indices):
                if self._closing.is_set():
                    raise Closed()
                base = got
                try:
                    for position, count, lengths, data in self._attempt(
                            indices[got:], epoch_start, ahead):
                        epoch_start = False
                        got = base + position + count
                        failing_since, delay = None, _FIRST_BACKOFF
                        yield base + position, lengths, data
                except grpc.RpcError as err:
                    if self._closing.is_set():
                        raise Closed() from err
                    exc = from_rpc_error(err, self.target)
                    if not isinstance(exc, ServerUnavailableError):
                        raise exc from err
                    now = time.monotonic()
                    if failing_since is None:
                        failing_since = now
                        log.log(self.lost_level, "lost cacheserver at %s while reading cache "
                                "%r (%s); reconnecting for up to %gs", self.target,
                                self._cache.name, err.details(), self._timeout)
                    left = self._timeout - (now - failing_since)
                    if left <= 0:
                        raise ReconnectTimeoutError(
                            f"lost cacheserver at {self.target} in the middle of "
                            f"reading cache {self._cache.name!r} and could not reconnect "
                            f"within reconnect_timeout={self._timeout:g}s: start the daemon "
                            "again (the read resumes where it stopped if it is back in time) "
                            "or raise reconnect_timeout=") from err
                    self._closing.wait(min(delay, left))  # backoff; wakes at once on close
                    delay = min(delay * 2, _MAX_BACKOFF)
                    epoch_start = False  # the failed try was sent: its hit is counted
        finally:
            for call in ahead.values():  # kept by the last try, read by none
                call.cancel()

    def _attempt(self, indices: Indices, epoch_start: bool, ahead: Ahead
                 ) -> Iterator[tuple[int, int, bytes, bytes]]:
        """One try at indices: (position in indices, elements, lengths, data) chunks, in order.

        A run of consecutive indices (stored order: every unshuffled read) goes
        over ReadShard, a cursor walk with read-ahead, in whole blocks: a chunk
        may start before the first index (negative position) and end after the
        last; Decoder trims. Any other list goes over ReadElements, one key
        lookup per record, one element per value. ahead: what a failed try left
        for this one (FleetFetcher); one daemon sends nothing ahead.
        """
        first = int(indices[0])
        if not is_run(indices):
            yield from self._stream(self._transport.stub.ReadElements(pb.ReadElementsRequest(
                name=self._cache.name, fingerprint=self._cache.fingerprint,
                indices=np.asarray(indices, "<u8").tobytes(), chunk_bytes=self.chunk_bytes,
                epoch_start=epoch_start)), 0, "position", None)
            return
        for shard, start, count in shard_runs(self._cache, first, first + len(indices)):
            call = self._transport.stub.ReadShard(pb.ReadShardRequest(
                name=self._cache.name, shard=shard.index, start=start, count=count,
                chunk_bytes=self.chunk_bytes,
                fingerprint=self._cache.fingerprint, epoch_start=epoch_start))
            epoch_start = False
            yield from self._stream(call, shard.first_element - first, "start",
                                    shard.num_elements)

    def _stream(self, call: Any, offset: int, field: str, shard_elements: int | None
                ) -> Iterator[tuple[int, int, bytes, bytes]]:
        """Chunks of one call as (offset + chunk.<field>, elements, lengths, data);
        cancel() stops it. shard_elements: the call is a ReadShard of whole blocks
        (k elements each, the shard's last one possibly short)."""
        with self._lock:
            self._calls.add(call)
        try:
            if self._closing.is_set():
                call.cancel()
            for chunk in call:
                start, values = getattr(chunk, field), len(chunk.lengths) // 4
                count = values if shard_elements is None else min(
                    values * self._k, shard_elements - start)
                yield offset + start, count, chunk.lengths, chunk.data
        finally:
            with self._lock:
                self._calls.discard(call)
