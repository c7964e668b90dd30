"""Fetchers: records by global index, as chunks. One interface, four kinds, one reconnect.

Every read asks its records of one :class:`Fetcher`: the leased shard files on
this host (client/read/direct.py), the daemon's data plane (client/read/plane.py),
gRPC (:class:`GrpcFetcher`), or a fleet's owners (client/read/fleet_fetch.py);
client/read/fetchers.py picks it. The three that cross a network are
:class:`Remote`\\ s: one try at a time, each raising ``grpc.RpcError`` (or the data
plane's error in its shape) when it fails. :class:`Reconnecting` turns any
Remote into a Fetcher: a try that fails with UNAVAILABLE (daemon restarted,
connection dropped) is tried again for the indices not yet received, with
exponential backoff, until ``reconnect_timeout`` seconds pass without progress;
the fingerprint travels with every request, so a cache replaced meanwhile fails
with FingerprintMismatchError instead of mixing data. Everything received is
delivered, so the next undelivered index is the next one not received. What a
remote keeps from one try for the next (a fleet's calls asked ahead) lives in
its :class:`Request`, not here.

gRPC: a run of consecutive indices (the stored order, as every unshuffled read
is) goes over ReadShard with start/count, a cursor walk with read-ahead that
costs less per element; any other list (shuffled positions) over ReadElements.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import numpy as np

from client._transport import Transport, pb
from client.errors import (
    ReconnectTimeoutError,
    ServerUnavailableError,
    ShardcacheError,
    from_rpc_error,
)
from client.format.layout import Layout
from client.wire.limits import MAX_INDICES

log = logging.getLogger("client")
_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 2.0

#: (position in the request, u32 lengths, data); a direct read of a layout decode_into
#: handles passes data as the values' memoryviews into the shard's map instead.
Chunk = tuple[int, bytes, Any]
#: One try's chunk: (position in the try's indices, elements, u32 lengths, data).
Piece = tuple[int, int, bytes, Any]
Indices = np.ndarray | range  # global element indices; a range is the stored order


class Closed(ShardcacheError):
    """Raised in a fetch, or a call it waits on, when its read has been closed: its dataset
    or iterator went away, its reader stopped, or another request of it failed (cause)."""

    def __init__(self, cache: str = "", cause: str = "") -> None:
        of = f" of cache {cache!r}" if cache else ""
        why = (f" after another of its requests failed: {cause}" if cause
               else " (its dataset, iterator or source was closed)")
        super().__init__(f"the read{of} was closed{why}; this request was cancelled")


class Fetcher(Protocol):
    """Records by global index, as chunks: what a read (client/read/chunks.py) asks of."""

    #: How the chunks come, for the read's report: "direct", "plane", "grpc" or "fleet".
    path: str

    def stream(self, indices: Indices, epoch_start: bool = False) -> Iterator[Chunk]:
        """The records at indices as chunks, in order; epoch_start: this request starts a
        pass (the daemon counts its hit once). Thread-safe."""
        ...

    def failed(self, cause: ShardcacheError) -> None:
        """The read failed for good with cause: end what serves only its requests (a data
        plane's lease); requests in flight on other threads may finish, or end with a
        Closed naming cause."""
        ...

    def close(self) -> None:
        """End the read: calls in flight cancelled (they raise Closed), leases ended."""
        ...


class Request(Protocol):
    """One request's tries at a Remote; each try asks for what the last did not deliver."""

    def attempt(self, indices: Indices, epoch_start: bool) -> Iterator[Piece]:
        """One try at indices: chunks in order; grpc.RpcError when it fails."""
        ...

    def close(self) -> None:
        """The request is over: end what its tries kept for each other."""
        ...


class Remote(Protocol):
    """A fetcher across a network, driven one try at a time by :class:`Reconnecting`."""

    path: str
    #: Who the messages name, and at which level the first loss of it is logged.
    target: str
    lost_level: int

    def request(self) -> Request: ...

    def failed(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class Stateless:
    """A Request whose tries keep nothing for each other (one daemon's)."""

    attempt: Any  # (indices, epoch_start) -> Iterator[Piece]

    def close(self) -> None:
        pass


class Calls:
    """A read's calls in flight, cancelled together when the read closes; thread-safe."""

    def __init__(self) -> None:
        self.closing = threading.Event()
        self.cause = ""  # why the read failed, once it has
        self._lock = threading.Lock()
        self._calls: set[Any] = set()

    def cancel(self) -> None:
        self.closing.set()
        with self._lock:
            for call in self._calls:
                call.cancel()

    def stream(self, call: Any, offset: int, field: str, k: int,
               shard_elements: int | None) -> Iterator[Piece]:
        """Chunks of one call as (offset + chunk.<field>, elements, lengths, data); cancel()
        stops it. shard_elements: the call is a ReadShard of whole blocks (k elements each,
        the shard's last one possibly short)."""
        with self._lock:
            self._calls.add(call)
        try:
            if self.closing.is_set():
                call.cancel()
            for chunk in call:
                start, values = getattr(chunk, field), len(chunk.lengths) // 4
                count = values if shard_elements is None else min(
                    values * k, shard_elements - start)
                yield offset + start, count, chunk.lengths, chunk.data
        finally:
            with self._lock:
                self._calls.discard(call)


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


class GrpcFetcher:
    """A Remote: one daemon's records over ReadShard and ReadElements."""

    path = "grpc"
    lost_level = logging.WARNING

    def __init__(self, transport: Transport, cache: pb.Cache, calls: Calls,
                 chunk_bytes: int) -> None:
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

    def attempt(self, indices: Indices, epoch_start: bool) -> Iterator[Piece]:
        """One try at indices: (position in indices, elements, lengths, data) chunks, in order.

        A run of consecutive indices (stored order: every unshuffled read) goes
        over ReadShard, a cursor walk with read-ahead, in whole blocks: a chunk
        may start before the first index (negative position) and end after the
        last; Decoder trims. Any other list goes over ReadElements, one key
        lookup per record, one element per value.
        """
        first = int(indices[0])
        stub, cache = self._transport.stub, self.cache
        if not is_run(indices):
            yield from self._calls.stream(stub.ReadElements(pb.ReadElementsRequest(
                name=cache.name, fingerprint=cache.fingerprint,
                indices=np.asarray(indices, "<u8").tobytes(), chunk_bytes=self.chunk_bytes,
                epoch_start=epoch_start)), 0, "position", self.k, None)
            return
        for shard, start, count in shard_runs(cache, first, first + len(indices)):
            call = stub.ReadShard(pb.ReadShardRequest(
                name=cache.name, shard=shard.index, start=start, count=count,
                chunk_bytes=self.chunk_bytes, fingerprint=cache.fingerprint,
                epoch_start=epoch_start))
            epoch_start = False
            yield from self._calls.stream(call, shard.first_element - first, "start", self.k,
                                          shard.num_elements)


class Reconnecting:
    """A Fetcher over a Remote that tries again, for what did not arrive, while the daemon
    is away; thread-safe."""

    def __init__(self, remote: Remote, calls: Calls, cache_name: str,
                 reconnect_timeout: float) -> None:
        self._remote = remote
        self._calls = calls
        self._name = cache_name
        self._timeout = reconnect_timeout
        self.path = remote.path

    def failed(self, cause: ShardcacheError) -> None:
        self._calls.cause = self._calls.cause or str(cause)
        self._remote.failed()

    def close(self) -> None:
        self._calls.cancel()
        self._remote.close()

    def stream(self, indices: Indices, epoch_start: bool = False) -> Iterator[Chunk]:
        """The records at indices as chunks arrive, trying again on UNAVAILABLE.

        indices is an array of global indices, or a range (the stored order,
        never materialized). epoch_start: this request starts a pass (the daemon
        counts a hit, once).
        """
        got = 0
        failing_since: float | None = None
        delay = _FIRST_BACKOFF
        closing, target = self._calls.closing, self._remote.target
        request = self._remote.request()
        try:
            while got < len(indices):
                if closing.is_set():
                    raise Closed(self._name, self._calls.cause)
                base = got
                try:
                    for position, count, lengths, data in request.attempt(indices[got:],
                                                                          epoch_start):
                        epoch_start = False
                        got = base + position + count
                        failing_since, delay = None, _FIRST_BACKOFF
                        yield base + position, lengths, data
                except grpc.RpcError as err:
                    if closing.is_set():
                        raise Closed(self._name, self._calls.cause) from err
                    exc = from_rpc_error(err, target)
                    if not isinstance(exc, ServerUnavailableError):
                        raise exc from err
                    now = time.monotonic()
                    if failing_since is None:
                        failing_since = now
                        log.log(self._remote.lost_level, "lost cacheserver at %s while "
                                "reading cache %r (%s); reconnecting for up to %gs", target,
                                self._name, err.details(), self._timeout)
                    left = self._timeout - (now - failing_since)
                    if left <= 0:
                        raise ReconnectTimeoutError(
                            f"lost cacheserver at {target} in the middle of "
                            f"reading cache {self._name!r} and could not reconnect "
                            f"within reconnect_timeout={self._timeout:g}s: start the daemon "
                            "again (the read resumes where it stopped if it is back in time) "
                            "or raise reconnect_timeout=") from err
                    closing.wait(min(delay, left))  # backoff; wakes at once on close
                    delay = min(delay * 2, _MAX_BACKOFF)
                    epoch_start = False  # the failed try was sent: its hit is counted
        finally:
            request.close()
