"""The one choice of a pass's fetcher (fetching/fetch.py's Fetcher): which kind reads it.

In order: the leased shard files when this process sees the daemon's (a same-host
pass, client/read/fetching/direct.py; a partially resident cache's streamed shards
through the daemon beside them, client/read/fetching/partial.py); a fleet's owners
when the cache is read from a fleet (client/read/fetching/fleet.py); the daemon's data
plane when it offers one (client/read/fetching/plane.py); else gRPC. The three remote
kinds reconnect alike (fetch.Reconnecting).
"""

from __future__ import annotations

from client._fleet import Fleet, routed
from client._transport import Transport, pb
from client.format.codec import Empty
from client.read.fetching import plane as data_plane
from client.read.fetching.direct import DirectReads
from client.read.fetching.fetch import Calls, Fetcher, Remote
from client.read.fetching.fleet import FleetFetcher
from client.read.fetching.partial import PartialFetcher
from client.read.fetching.plane import PlaneFetcher
from client.read.fetching.reconnect import Reconnecting
from client.read.fetching.rpc import GrpcFetcher
from client.wire.limits import MAX_CHUNK_BYTES


def message_bytes(chunk_bytes: int) -> int:
    """Record bytes asked per message (or per local chunk) for chunks of chunk_bytes: a
    chunk's bytes in one where they fit, between 1 MiB and the protocol's most."""
    return min(max(chunk_bytes + (64 << 10), 1 << 20), MAX_CHUNK_BYTES)


def open_fetcher(
    transport: Transport,
    cache: pb.Cache,
    reconnect_timeout: float,
    chunk_bytes: int,
    reading: bool = True,
    direct: DirectReads | None = None,
    fleet: Fleet | None = None,
    empty: Empty | None = None,
    pass_shards: list[int] | None = None,
) -> tuple[Fetcher, bool]:
    """(the fetcher of one pass over cache, whether the daemon counted the pass's hit
    already). reading: the pass reads something (no lease is taken for an empty one);
    direct: how this dataset reads directly (None: never); fleet: the fleet read from;
    empty: makes the arrays a data-plane pass receives chunks into; pass_shards: the
    shards the pass reads, in its order (the lease tells the daemon)."""
    per_message = message_bytes(chunk_bytes)
    by_owner = fleet is not None and routed(cache)
    counted = False
    local = None
    if direct is not None and reading and not by_owner:
        local, counted = direct.fetcher(cache, pass_shards=pass_shards or ())
        if local is not None:
            local.chunk_bytes = per_message
            if not local.streamed:
                return local, counted
    calls = Calls()
    grpc_fetcher = GrpcFetcher(transport, cache, calls, per_message)
    remote: Remote = grpc_fetcher
    if fleet is not None and by_owner:  # members on this host are read from their files
        remote = FleetFetcher(fleet, cache, calls, per_message, direct)
    elif reading:  # its requests count the hit
        lease = data_plane.for_transport(transport).lease(cache, empty)
        if lease is not None:
            remote = PlaneFetcher(lease, grpc_fetcher)
    reconnecting = Reconnecting(remote, calls, cache.name, reconnect_timeout)
    if local is not None:  # a partially resident cache: its streamed shards go remote
        return PartialFetcher(local, reconnecting, local.streamed), counted
    return reconnecting, counted
