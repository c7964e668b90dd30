"""FleetFetcher: a fleet read's records, each shard's from its owner (client/_fleet.py)."""

from __future__ import annotations

import collections
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

from client._fleet import Fleet
from client._transport import pb
from client.errors import ServerUnavailableError, ShardcacheError
from client.format.layout import Layout
from client.format.values import split_chunk
from client.read.fetching import plane as data_plane
from client.read.fetching.direct import DirectReads, LocalFetcher
from client.read.fetching.fetch import Calls, Indices, Land, Piece, is_run, shard_runs
from client.read.fetching.fleet_calls import MemberQueue
from client.read.fetching.plane import Ask, PlaneCall, PlaneLease
from client.wire import plane

#: A fleet request's shard calls asked ahead of the one being read (fleet_calls.py).
CALLS_AHEAD = 32
#: A fleet read's calls asked ahead and not read when its try failed, by (member, shard,
#: start, count): the request's next try reads them (client/read/fetching/fleet_calls.py).
Ahead = dict[tuple[str, int, int, int], Any]


class FleetFetcher:
    """A Remote over a fleet (client/_fleet.py): each shard's records from its owner.

    A run of the stored order is one ReadShard per shard, to the shard's owner;
    the calls of the shard being read and the next CALLS_AHEAD are asked at once,
    queued per member and sent in the epoch's order within STREAMS_PER_MEMBER
    streams per member (client/_fleet.py, client/read/fetching/fleet_calls.py). Other
    indices are grouped by owner, one ReadElements each, and put back in request
    order. A member found down is skipped (its shards go to their next owners)
    and what it had not sent is asked of them; what arrived is kept, and so are
    the calls asked ahead of the other members, which the request's next try
    reads instead of asking again. Members on this host are read from their files.
    """

    path = "fleet"
    lost_level = logging.DEBUG  # the fleet said which member, and who serves now

    def __init__(
        self,
        fleet: Fleet,
        cache: pb.Cache,
        calls: Calls,
        chunk_bytes: int,
        direct: DirectReads | None = None,
    ) -> None:
        self._fleet = fleet
        self._cache = cache
        self._calls = calls
        self._k = Layout.from_json(cache.layout_json).block_elements
        self.chunk_bytes = chunk_bytes
        self.target = f"targets {fleet!r}"
        self._firsts = np.array([s.first_element for s in cache.shards], np.uint64)
        self._local: dict[str, LocalFetcher] = {}
        self._queues: dict[str, MemberQueue] = {}  # this read's calls per member
        self._queues_lock = threading.Lock()
        self._planes: dict[str, PlaneLease | None] = {}  # each member's data plane, leased
        self._planes_lock = threading.Lock()
        if direct is not None and direct.mode is not False:
            self._lease_local(direct)

    def _lease_local(self, direct: DirectReads) -> None:
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
                    local, _ = reads.fetcher(self._cache, shards)  # a hit on each member
                except ServerUnavailableError as exc:
                    self._fleet.mark_down(member, str(exc))
                    continue
                if local is not None:
                    self._local[member] = local
        except BaseException:
            self.close()
            raise

    def request(self) -> _FleetRequest:
        return _FleetRequest(self)

    def failed(self) -> None:
        pass

    def close(self) -> None:
        """End the leases on the members on this host and on the members' data planes."""
        local, self._local = self._local, {}
        for fetcher in local.values():
            fetcher.close()
        with self._planes_lock:
            planes, self._planes = self._planes, {}
        for plane_lease in planes.values():
            if plane_lease is not None:
                plane_lease.close()

    def _connection(self, member: str) -> tuple[PlaneLease, socket.socket] | None:
        """A data connection to member for one request (its plane leased on first use), or
        None: ask over gRPC (no plane, unreachable, or the member is down: the call fails
        and the fleet fails over)."""
        with self._planes_lock:
            if member not in self._planes:
                try:
                    self._planes[member] = data_plane.for_transport(
                        self._fleet.transport(member)
                    ).lease(self._cache)
                except ShardcacheError:
                    return None  # not remembered: asked again on the next try
            lease = self._planes[member]
        sock = lease.connection() if lease is not None else None
        return (lease, sock) if lease is not None and sock is not None else None

    def _local_for(self, member: str, shard: int) -> LocalFetcher | None:
        local = self._local.get(member)
        return local if local is not None and local.holds(shard) else None

    def attempt(self, indices: Indices, epoch_start: bool, ahead: Ahead) -> Iterator[Piece]:
        """One try at indices; ahead: the calls a failed try of the same request asked
        ahead of members still up, which this one reads instead of asking again."""
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
                epoch_start = next(hit, False)
                connected = self._connection(member)
                if connected is not None:
                    return PlaneCall(
                        *connected,
                        plane.REQUEST.pack(
                            plane.SHARD,
                            plane.EPOCH_START if epoch_start else 0,
                            shard.index,
                            start,
                            count,
                            self.chunk_bytes,
                        ),
                    )
                return self._fleet.transport(member).stub.ReadShard(
                    pb.ReadShardRequest(
                        name=self._cache.name,
                        shard=shard.index,
                        start=start,
                        count=count,
                        chunk_bytes=self.chunk_bytes,
                        fingerprint=self._cache.fingerprint,
                        epoch_start=epoch_start,
                    )
                )

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
                        yield (
                            position + lo - first,
                            min(values * self._k, shard.num_elements - at),
                            lengths,
                            data,
                        )
                    continue
                try:
                    with self._fleet.watching(member):
                        yield from self._calls.stream(
                            calls.pop(i),
                            shard.first_element - first,
                            "start",
                            self._k,
                            shard.num_elements,
                        )
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
            by_member = np.array([self._fleet.owner(self._cache.name, int(s)) for s in touched])[
                shard_of
            ]
            failed: grpc.RpcError | None = None
            for member in np.unique(by_member):
                positions = missing[by_member == member]
                local = self._local.get(str(member))
                if local is not None and all(
                    local.holds(int(s)) for s in np.unique(shards[positions])
                ):
                    place(positions, local.gather(indices[positions]))
                    continue
                permits = self._fleet.permits(str(member))
                permits.acquire()  # this thread holds no other
                try:
                    with self._fleet.watching(str(member)):
                        place(
                            positions, self._elements(str(member), indices[positions], epoch_start)
                        )
                        epoch_start = False
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                        raise
                    failed = err
                finally:
                    permits.release()
            left = np.array([p for p in missing if values[p] is None], np.int64)
            if failed is not None and left.size == missing.size:
                raise failed  # nobody answered: Reconnecting backs off and tries again
            missing = left
        return 0, len(indices), b"", values

    def _elements(
        self, member: str, indices: np.ndarray, epoch_start: bool
    ) -> Iterator[tuple[int, bytes, Any]]:
        """The records at indices from member, over its data plane or ReadElements:
        (position, u32 lengths, data) chunks."""
        wanted = indices.astype("<u8").tobytes()
        connected = self._connection(member)
        if connected is not None:
            lease, sock = connected
            request = (
                plane.REQUEST.pack(
                    plane.ELEMENTS,
                    plane.EPOCH_START if epoch_start else 0,
                    len(indices),
                    0,
                    0,
                    self.chunk_bytes,
                )
                + wanted
            )
            for _, position, _values, lengths, data in lease.responses(sock, [Ask(request)]):
                yield position, lengths, data
            return
        call = self._fleet.transport(member).stub.ReadElements(
            pb.ReadElementsRequest(
                name=self._cache.name,
                fingerprint=self._cache.fingerprint,
                indices=wanted,
                chunk_bytes=self.chunk_bytes,
                epoch_start=epoch_start,
            )
        )
        for at, _, sizes, values in self._calls.stream(call, 0, "position", self._k, None):
            yield at, sizes, values


class _FleetRequest:
    """One request's tries at a fleet: the calls a failed try asked ahead, for the next."""

    def __init__(self, fetcher: FleetFetcher) -> None:
        self._fetcher = fetcher
        self._ahead: Ahead = {}

    def attempt(
        self, indices: Indices, epoch_start: bool, land: Land | None = None
    ) -> Iterator[Piece]:
        """land: unused (members' chunks are received as they come)."""
        return self._fetcher.attempt(indices, epoch_start, self._ahead)

    def close(self) -> None:
        for call in self._ahead.values():  # kept by the last try, read by none
            call.cancel()
        self._ahead.clear()
