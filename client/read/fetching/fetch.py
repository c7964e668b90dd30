"""Fetchers: records by global index, as chunks. One interface, four kinds, one reconnect.

Every read asks its records of one :class:`Fetcher`: the leased shard files on
this host (fetching/direct.py), the daemon's data plane (fetching/plane.py), gRPC
(fetching/rpc.py), or a fleet's owners (fetching/fleet.py); fetching/factory.py
picks it. The three that cross a network are :class:`Remote`\\ s, driven one try
at a time by fetching/reconnect.py's Reconnecting, which makes any of them a
Fetcher that outlives a daemon's restart. What a remote keeps from one try for
the next (a fleet's calls asked ahead) lives in its :class:`Request`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from client._transport import pb
from client.errors import ShardcacheError
from client.format.layout import Layout
from client.wire.limits import MAX_INDICES

#: (position in the request, u32 lengths, data); a direct read of a layout decode_into
#: handles passes data as the values' memoryviews into the shard's map instead.
Chunk = tuple[int, bytes, Any]
#: One try's chunk: (position in the try's indices, elements, u32 lengths, data).
Piece = tuple[int, int, bytes, Any]
Indices = np.ndarray | range  # global element indices; a range is the stored order


@dataclass
class Landed:
    """A chunk's stored values received straight into the rows of the batch they decode into
    (client/read/assembly/landing.py), not yet checked: each value's header (tag and CRC-32)
    in heads, its body in bodies, one part per leaf, each part the value's row of that
    leaf's batch array (a block's body: one part, its records' rows of the one leaf); rows:
    the leaves' rows the chunk fills; per: the elements each value holds (a block's k, the
    last value the rest), 1 for single elements."""

    heads: list[memoryview]
    bodies: list[list[memoryview]]
    rows: list[np.ndarray]
    per: int = 1

    def buffers(self) -> list[memoryview]:
        """Where the values' bytes go, in the order they come."""
        return [part for head, body in zip(self.heads, self.bodies) for part in (head, *body)]


#: Where a chunk of a request's values can be received (a data-plane chunk): given its
#: position in the request, its values' sizes and the elements they hold (as many as
#: values for single elements; a block holds k, a shard's last one the rest), a Landed to
#: receive them into, or None (received as they come, then decoded).
Land = Callable[[int, np.ndarray, int], Landed | None]


def shifted(land: Land | None, base: int) -> Land | None:
    """land for the indices from base on (a request's rest, or its part)."""
    if land is None or not base:
        return land
    return lambda position, sizes, elements: land(base + position, sizes, elements)


class Closed(ShardcacheError):
    """Raised in a fetch, or a call it waits on, when its read has been closed: its dataset
    or iterator went away, its reader stopped, or another request of it failed (cause)."""

    def __init__(self, cache: str = "", cause: str = "") -> None:
        of = f" of cache {cache!r}" if cache else ""
        why = (
            f" after another of its requests failed: {cause}"
            if cause
            else " (its dataset, iterator or source was closed)"
        )
        super().__init__(f"the read{of} was closed{why}; this request was cancelled")


class Fetcher(Protocol):
    """Records by global index, as chunks: what a read (client/read/assembly/chunks.py) asks of."""

    #: How the chunks come, for the read's report: "direct", "plane", "grpc" or "fleet".
    path: str

    def stream(
        self, indices: Indices, epoch_start: bool = False, land: Land | None = None
    ) -> Iterator[Chunk]:
        """The records at indices as chunks, in order; epoch_start: this request starts a
        pass (the daemon counts its hit once); land: where its values may be received
        (a fetcher that receives them, the data plane's, yields a chunk it landed with a
        Landed as its data). Thread-safe."""
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

    def attempt(
        self, indices: Indices, epoch_start: bool, land: Land | None = None
    ) -> Iterator[Piece]:
        """One try at indices: chunks in order; grpc.RpcError when it fails. land: as
        Fetcher.stream's, for these indices."""
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

    def stream(
        self, call: Any, offset: int, field: str, k: int, shard_elements: int | None
    ) -> Iterator[Piece]:
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
                count = (
                    values if shard_elements is None else min(values * k, shard_elements - start)
                )
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
    """(shard, shard-local start, count) of each shard holding global indices [first, stop).

    The first shard is found by bisection: a pass asks once per chunk, and walking every
    shard each time made a pass over a cache of many shards quadratic."""
    shards = cache.shards
    index = max(0, int(np.searchsorted(_firsts(cache), first, side="right")) - 1)
    while index < len(shards):
        shard = shards[index]
        if shard.first_element >= stop:
            return
        end = shard.first_element + shard.num_elements
        if end > first:
            start = max(first, shard.first_element)
            yield shard, start - shard.first_element, min(stop, end) - start
        index += 1


#: The shards' first elements of the caches read lately, by id (a pb.Cache is unhashable).
_FIRSTS: dict[int, tuple[pb.Cache, np.ndarray]] = {}
_FIRSTS_KEPT = 64


def _firsts(cache: pb.Cache) -> np.ndarray:
    entry = _FIRSTS.get(id(cache))
    if entry is None or entry[0] is not cache or len(entry[1]) != len(cache.shards):
        firsts = np.fromiter((s.first_element for s in cache.shards), np.uint64, len(cache.shards))
        if len(_FIRSTS) >= _FIRSTS_KEPT:
            _FIRSTS.clear()
        entry = _FIRSTS[id(cache)] = (cache, firsts)
    return entry[1]
