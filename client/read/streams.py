"""Reads an epoch's positions: parallel streams, reconnect, bounded memory.

Shuffled positions are fetched over ReadElements (records by global index);
runs of consecutive indices, as every unshuffled read is, over ReadShard with
start/count, a cursor walk with read-ahead that costs less per element.

The producer thread cuts the positions [first, stop) into requests of about
``request_bytes`` of stored records, maps each to global indices with the
epoch's order, and keeps ``parallel`` requests in flight on a pool of fetch
threads. It takes their results strictly in request order, so the output order
is deterministic whatever the timing (resume is exact), and hands each ~1 MiB
chunk to the decode pool; decoded batches wait in the byte-bounded prefetch
queue (client/read/prefetch.py).

A request whose stream fails with UNAVAILABLE (daemon restarted, connection
dropped) is sent again for the indices not yet received, with exponential
backoff, until ``reconnect_timeout`` seconds pass without progress; the
fingerprint travels with every request, so a cache replaced meanwhile fails
with FingerprintMismatchError instead of mixing data. Everything received is
delivered, so the next undelivered index is the next one not received.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from client._transport import Transport, pb
from client.errors import (
    DataLossError,
    ReconnectTimeoutError,
    ServerUnavailableError,
    from_rpc_error,
)
from client.format.blocks import decode_values
from client.format.codec import RecordError
from client.format.fixed_decode import decode_into, handles
from client.format.layout import Layout
from client.format.values import Decompressor, split_chunk
from client.read.fleet_calls import MemberQueue
from client.read.order import EpochOrder
from client.read.plan import ReadOptions, epoch_range
from client.read.prefetch import Closed, Prefetcher

log = logging.getLogger("client")
CHUNK_BYTES = 1 << 20
DEFAULT_PREFETCH_BYTES = 256 << 20
MAX_REQUEST_INDICES = 65536  # the daemon's limit (client/format/lookup.py)
_MIN_REQUEST_BYTES, _MAX_REQUEST_BYTES = 256 << 10, 8 << 20
_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 2.0
#: A fleet request's shard calls asked ahead of the one being read (fleet_calls.py).
CALLS_AHEAD = 32
if TYPE_CHECKING:
    from client._fleet import Fleet
    from client.read.direct import DirectReads, LocalFetcher, ReadLease

#: (position in the request, u32 lengths, data); a direct read of a layout decode_into
#: handles passes data as the values' memoryviews into the shard's map instead.
Chunk = tuple[int, bytes, Any]
#: A fleet read's calls asked ahead and not read when its try failed, by (member, shard,
#: start, count): the next try reads them (client/read/fleet_calls.py).
Ahead = dict[tuple[str, int, int, int], Any]


def stored_bytes(chunk: Chunk) -> int:
    data = chunk[2]
    return sum(map(len, data)) if isinstance(data, list) else len(data)
Indices = np.ndarray | range  # global element indices; a range is the stored order


def request_size(cache: pb.Cache, parallel: int, prefetch_bytes: int) -> int:
    """Indices per request: k requests in flight hold about prefetch_bytes / 4 stored bytes.

    On a cache of blocks a request may be 4x larger: the daemon decompresses each block
    a request touches once, so a shuffled read decompresses less per element the more
    elements a request holds (docs/format.md, "Blocks").
    """
    avg = cache.stored_bytes / cache.num_elements if cache.num_elements else 1.0
    most = _MAX_REQUEST_BYTES * (4 if Layout.from_json(cache.layout_json).block_elements > 1
                                 else 1)
    budget = min(max(prefetch_bytes // (4 * parallel), _MIN_REQUEST_BYTES), most)
    return int(min(max(budget // max(avg, 1.0), 1), MAX_REQUEST_INDICES))


def chunk_positions(cache: pb.Cache, stored_bytes: int) -> int:
    """Positions per chunk of about stored_bytes of records, whole blocks of a blocked cache."""
    avg = cache.stored_bytes / cache.num_elements if cache.num_elements else 1.0
    k = Layout.from_json(cache.layout_json).block_elements
    n = int(min(max(stored_bytes // max(avg, 1.0), 1), MAX_REQUEST_INDICES))
    return max(n // k * k, k) if k > 1 else n


def is_run(indices: Indices) -> bool:
    """True for consecutive indices (the stored order, a worker's share), read as a run."""
    return not isinstance(indices, np.ndarray) or bool(np.all(np.diff(indices) == 1))


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


class FleetFetcher(Fetcher):
    """A Fetcher over a fleet (client/_fleet.py): each shard's records from its owner.

    A run of the stored order is one ReadShard per shard, to the shard's owner;
    the calls of the shard being read and the next CALLS_AHEAD are asked at once,
    queued per member and sent in the epoch's order within STREAMS_PER_MEMBER
    streams per member (client/_fleet.py, client/read/fleet_calls.py). Other
    indices are grouped by owner, one ReadElements each, and put back in request
    order. A member found down is skipped (its shards go to their next owners)
    and what it had not sent is asked of them; what arrived is kept, and so are
    the calls asked ahead of the other members, which the next try reads instead
    of asking again. Members on this host are read from their files.
    """

    def __init__(self, fleet: Fleet, cache: pb.Cache, reconnect_timeout: float,
                 closing: threading.Event, direct: DirectReads | None = None) -> None:
        super().__init__(fleet.transport(fleet.owner(cache.name, -1)), cache,
                         reconnect_timeout, closing)
        self._fleet = fleet
        self.target = f"targets {fleet!r}"
        self.lost_level = logging.DEBUG  # the fleet said which member, and who serves now
        self._firsts = np.array([s.first_element for s in cache.shards], np.uint64)
        self._local: dict[str, tuple[ReadLease, LocalFetcher]] = {}
        self._queues: dict[str, MemberQueue] = {}  # this read's calls per member
        self._queues_lock = threading.Lock()
        if direct is not None and direct.mode is not False:
            self._lease_local(direct, closing)

    def _lease_local(self, direct: DirectReads, closing: threading.Event) -> None:
        """Lease the shards each member on this host owns: read from its files (docs/direct.md).

        A member is on this host when its lease's token file is visible here (one probe per
        member and process); the others' shards go over gRPC."""
        owned: dict[str, list[int]] = collections.defaultdict(list)
        for shard in self._cache.shards:
            owned[self._fleet.owner(self._cache.name, shard.index)].append(shard.index)
        try:
            for member, shards in owned.items():
                reads = direct.member(self._fleet.transport(member))
                try:
                    lease, _ = reads.lease(self._cache, shards)  # a hit on each member
                except ServerUnavailableError as exc:
                    self._fleet.mark_down(member, str(exc))
                    continue
                if lease is not None:
                    self._local[member] = (lease, lease.fetcher(closing))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the leases on the members on this host."""
        leases, self._local = self._local, {}
        for lease, _ in leases.values():
            lease.close()

    def _local_for(self, member: str, shard: int) -> LocalFetcher | None:
        local = self._local.get(member)
        return local[1] if local is not None and local[0].holds(shard) else None

    def _attempt(self, indices: Indices, epoch_start: bool, ahead: Ahead
                 ) -> Iterator[tuple[int, int, bytes, bytes]]:
        if not is_run(indices):
            yield self._gathered(np.asarray(indices, np.uint64), epoch_start)
            return
        first = int(indices[0])
        runs = []  # (owner, shard, start, count, its LocalFetcher where read from files)
        for shard, start, count in shard_runs(self._cache, first, first + len(indices)):
            member = self._fleet.owner(self._cache.name, shard.index)
            runs.append((member, shard, start, count, self._local_for(member, shard.index)))

        def key(i: int) -> tuple[str, int, int, int]:
            member, shard, start, count, _ = runs[i]
            return member, shard.index, start, count

        # run -> its ReadShard call (fleet_calls.FleetCall): those a failed try asked ahead
        # of members still up (their owners unchanged) are read, not asked again
        calls = {i: ahead.pop(key(i)) for i in range(len(runs)) if key(i) in ahead}
        for call in ahead.values():
            call.cancel()
        ahead.clear()
        lost = None  # the member whose call failed with UNAVAILABLE
        hit = iter([epoch_start])  # the first call sent, on whichever thread, counts the hit

        def ask(i: int) -> None:
            member, shard, start, count, _ = runs[i]

            def send() -> Any:
                return self._fleet.transport(member).stub.ReadShard(pb.ReadShardRequest(
                    name=self._cache.name, shard=shard.index, start=start, count=count,
                    chunk_bytes=self.chunk_bytes, fingerprint=self._cache.fingerprint,
                    epoch_start=next(hit, False)))

            calls[i] = self._queue(member).submit(shard.first_element + start, send)

        try:
            for i, (member, shard, start, count, local) in enumerate(runs):
                # this run's call and the next ones' are asked: each member sends them in
                # the epoch's order, as many side by side as it admits streams from here
                for j in range(i, min(i + 1 + CALLS_AHEAD, len(runs))):
                    if runs[j][4] is None and j not in calls:
                        ask(j)
                if local is not None:
                    lo = shard.first_element + start  # chunks of whole blocks, as ReadShard's
                    for position, lengths, data in local.stream(range(lo, lo + count)):
                        values = len(data) if isinstance(data, list) else len(lengths) // 4
                        at = position + lo - shard.first_element  # in the shard
                        yield (position + lo - first,
                               min(values * self._k, shard.num_elements - at), lengths, data)
                    continue
                try:
                    with self._fleet.watching(member):
                        yield from self._stream(calls.pop(i), shard.first_element - first,
                                                "start", shard.num_elements)
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                        lost = member
                    raise
        finally:
            for i, call in calls.items():  # asked, not read
                if lost is not None and runs[i][0] != lost:
                    ahead[key(i)] = call  # the next try reads it
                else:  # this try was closed, or failed otherwise, or this is lost's call
                    call.cancel()

    def _queue(self, member: str) -> MemberQueue:
        with self._queues_lock:
            queue = self._queues.get(member)
            if queue is None:
                queue = self._queues[member] = MemberQueue(self._fleet.permits(member))
            return queue

    def _gathered(self, indices: np.ndarray, epoch_start: bool) -> tuple[int, int, Any, Any]:
        """Every record at indices, each from its shard's owner: (0, count, None, values)."""
        values: list[Any] = [None] * len(indices)
        shards = np.searchsorted(self._firsts, indices, side="right") - 1
        missing = np.arange(len(indices))

        def place(positions: np.ndarray, chunks: Iterator[Any]) -> None:
            """Each chunk's values at their positions in indices."""
            for position, lengths, data in chunks:
                got = data if isinstance(data, list) else split_chunk(lengths, data)
                for j, value in enumerate(got):
                    values[int(positions[position + j])] = value

        while missing.size:
            touched, shard_of = np.unique(shards[missing], return_inverse=True)
            by_member = np.array([self._fleet.owner(self._cache.name, int(s))
                                  for s in touched])[shard_of]
            failed: grpc.RpcError | None = None
            for member in np.unique(by_member):
                positions = missing[by_member == member]
                local = self._local.get(str(member))
                if local is not None and all(local[0].holds(int(s))
                                             for s in np.unique(shards[positions])):
                    place(positions, local[1].gather(indices[positions]))
                    continue
                permits = self._fleet.permits(str(member))
                permits.acquire()  # this thread holds no other
                call = self._fleet.transport(str(member)).stub.ReadElements(
                    pb.ReadElementsRequest(
                        name=self._cache.name, fingerprint=self._cache.fingerprint,
                        indices=indices[positions].astype("<u8").tobytes(),
                        chunk_bytes=self.chunk_bytes, epoch_start=epoch_start))
                epoch_start = False
                try:
                    with self._fleet.watching(str(member)):
                        place(positions, ((position, lengths, data) for position, _, lengths,
                                          data in self._stream(call, 0, "position", None)))
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                        raise
                    failed = err
                finally:
                    permits.release()
            left = np.array([p for p in missing if values[p] is None], np.int64)
            if failed is not None and left.size == missing.size:
                raise failed  # nobody answered: Fetcher.stream backs off and tries again
            missing = left
        return 0, len(indices), b"", values


class Decoder:
    """Decodes chunks of one cache; thread-safe (one Decompressor per thread)."""

    def __init__(self, cache: pb.Cache, layout: Layout) -> None:
        self._name = cache.name
        self._firsts = np.array([s.first_element for s in cache.shards], np.int64)
        # blocks as the cache has them (a format 1 cache has none), whatever the caller's
        stored = Layout.from_json(cache.layout_json)
        self._layout = dataclasses.replace(stored, leaves=layout.leaves)
        self._decode = decode_into if handles(self._layout) else decode_values
        self._local = threading.local()

    def _where(self, index: int) -> str:
        shard = int(np.searchsorted(self._firsts, index, side="right")) - 1
        local, k = index - int(self._firsts[shard]), self._layout.block_elements
        if k > 1:
            return (f"shard {shard} block {local // k} (elements {local - local % k}-"
                    f"{local - local % k + k - 1} of the shard, element {index})")
        return f"shard {shard} record {local} (element {index})"

    def __call__(self, indices: Indices, chunk: Chunk) -> tuple[int, list[Any]]:
        """Decode chunk, keeping only its elements at positions [0, len(indices))."""
        dec = getattr(self._local, "dec", None)
        if dec is None:
            dec = self._local.dec = Decompressor()
        position, lengths, data = chunk
        values: list[memoryview] = []
        try:
            values = data if isinstance(data, list) else split_chunk(lengths, data)
            n, batch = self._decode(self._layout, dec, values)
        except RecordError as exc:
            before = getattr(exc, "elements_before", None)
            if not values:
                where = f"chunk at position {position}"
            elif before is None:
                where = f"elements at positions {position}-{position + len(values) - 1}"
            elif position >= 0:
                where = self._where(int(indices[min(position + before, len(indices) - 1)]))
            else:
                where = self._where(int(indices[0]) + position + before)
            raise DataLossError(f"cache {self._name!r} {where} is corrupt: {exc}; delete the "
                                "cache and build it again") from exc
        lo, hi = max(0, -position), min(n, len(indices) - position)
        if lo or hi < n:  # a ReadShard chunk of whole blocks: trim to the request
            batch = [column[lo:hi] for column in batch]
        return hi - lo, batch


def read_positions(transport: Transport, cache: pb.Cache, layout: Layout, order: EpochOrder,
                   first: int, stop: int, *, parallel: int = 1, prefetch_bytes: int,
                   reconnect_timeout: float, decode_threads: int = 2,
                   lease: ReadLease | None = None, epoch_start: bool = True
                   ) -> Iterator[tuple[int, list[Any]]]:
    """Yield the elements at positions [first, stop) of order as (count, decoded batch).

    With a lease, records come from the leased shard files (client/read/direct.py).
    epoch_start: the first request starts a pass (the daemon counts a hit)."""
    transport.connect()
    expansion = cache.raw_bytes / cache.stored_bytes if cache.stored_bytes else 1.0
    per_request = request_size(cache, parallel, prefetch_bytes)
    closing = threading.Event()
    fetch: Fetcher | LocalFetcher = (lease.fetcher(closing) if lease is not None else
                                      Fetcher(transport, cache, reconnect_timeout, closing))
    decode = Decoder(cache, layout)
    fetch_pool = ThreadPoolExecutor(parallel, thread_name_prefix="shardcache-fetch")
    decode_pool = ThreadPoolExecutor(decode_threads, thread_name_prefix="shardcache-decode")

    def produce_in_order(put: Callable[[Future[tuple[int, list[Any]]], int], None]) -> None:
        """The stored order: one ReadShard stream per shard, chunks decoded as they come."""
        indices = range(first, stop)
        for chunk in fetch.stream(indices, epoch_start=epoch_start):
            put(decode_pool.submit(decode, indices, chunk), int(stored_bytes(chunk) * expansion))

    def produce(put: Callable[[Future[tuple[int, list[Any]]], int], None]) -> None:
        pending: collections.deque[tuple[np.ndarray, Future[list[Chunk]]]] = (
            collections.deque())
        starts = iter(range(first, stop, per_request))

        def submit() -> None:
            p0 = next(starts, None)
            if p0 is not None:
                indices = order.indices(np.arange(p0, min(p0 + per_request, stop)))
                pending.append((indices, fetch_pool.submit(fetch, indices,
                                                               epoch_start and p0 == first)))

        for _ in range(parallel):
            submit()
        while pending:
            indices, future = pending.popleft()
            chunks = future.result()
            submit()
            for chunk in chunks:
                put(decode_pool.submit(decode, indices, chunk),
                    int(stored_bytes(chunk) * expansion))

    in_order = order.mode == "none" and parallel == 1
    prefetcher = Prefetcher(produce_in_order if in_order else produce, prefetch_bytes,
                            on_close=fetch.cancel)
    try:
        for future in prefetcher:
            yield future.result()
    finally:
        for future in prefetcher.close():
            future.cancel()
        fetch_pool.shutdown(wait=True, cancel_futures=True)
        decode_pool.shutdown(wait=True, cancel_futures=True)


def read_epoch(transport: Transport, cache: pb.Cache, layout: Layout, options: ReadOptions,
               epoch: int, start: int, prefetch_bytes: int, direct: DirectReads | None = None
               ) -> Iterator[tuple[int, list[Any]]]:
    """This worker's share of one epoch of cache, from position start of the share.

    direct: read the shard files locally under a lease when it allows (client/read/direct.py).
    """
    order, first, stop = epoch_range(cache, options, epoch, start)
    lease, counted = direct.lease(cache) if direct is not None and first < stop else (None,
                                                                                     False)
    try:
        yield from read_positions(transport, cache, layout, order, first, stop,
                                  parallel=max(options.parallel_shards, 1),
                                  prefetch_bytes=prefetch_bytes,
                                  reconnect_timeout=options.reconnect_timeout, lease=lease,
                                  epoch_start=not counted)
    finally:
        if lease is not None:
            lease.close()
