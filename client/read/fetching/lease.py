"""Read leases: one pass's claim on a cache, acquired, renewed and released in one place.

A pass that reads a cache's shard files itself (client/read/fetching/direct.py) or takes its
bytes over the daemon's data plane (client/read/fetching/plane.py) holds a read lease
(AcquireReadLease) for as long as it reads: the daemon counts the cache as being
read, keeps its files while the lease lives, and (with ``data_plane=True``) hands
out a ticket for its data port. :func:`acquire` asks for one and says why not once;
:class:`Lease` renews it every third of its TTL on a thread of its own and releases
it once, a daemon gone meanwhile only logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from client._transport import Transport, pb
from client.errors import LeaseNotFoundError, ShardcacheError

log = logging.getLogger("client")


class NotGranted(Exception):
    """The daemon grants no read leases (an older daemon, or one that refuses them)."""


def acquire(
    transport: Transport,
    cache: pb.Cache,
    *,
    epoch_start: bool = False,
    shards: Sequence[int] = (),
    data_plane: bool = False,
    pass_shards: Sequence[int] = (),
) -> Lease:
    """A lease on cache for one pass, not yet renewing (Lease.renew_in_background).

    epoch_start: the lease counts the pass's hit; shards: only these are held
    (empty: all); data_plane: ask for a ticket to the data port; pass_shards: the
    pass's shards in its order (a daemon streaming some fetches them ahead). Raises the
    errors of the call (not found, replaced, unavailable) as they are, and
    NotGranted when the daemon answers with none of those but grants no lease.
    """
    request = pb.AcquireReadLeaseRequest(
        name=cache.name,
        fingerprint=cache.fingerprint,
        epoch_start=epoch_start,
        shards=shards,
        data_plane=data_plane,
        pass_shards=pass_shards,
    )
    try:
        granted = transport.call(transport.stub.AcquireReadLease, request)
    except ShardcacheError as exc:
        if type(exc) is not ShardcacheError:  # not found, replaced, unavailable: as gRPC
            raise
        raise NotGranted(f"the daemon does not grant read leases ({exc})") from exc
    return Lease(transport, granted)


class Lease:
    """One granted read lease: renewed in the background once asked, released once."""

    def __init__(self, transport: Transport, granted: pb.AcquireReadLeaseResponse) -> None:
        self.transport = transport
        self.granted = granted
        self.cache = granted.cache
        self._released = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def renew_in_background(self, lost: str) -> None:
        """Renew every third of the TTL until release(); lost: what the pass does once the
        lease cannot be renewed (logged once, with why)."""
        self._renewer = threading.Thread(
            target=self._renew, args=(lost,), name="shardcache-lease", daemon=True
        )
        self._renewer.start()

    def _renew(self, lost: str) -> None:
        interval = self.granted.ttl_seconds / 3
        request = pb.RenewReadLeaseRequest(lease_id=self.granted.lease_id)
        while not self._stop.wait(interval):
            try:
                self.transport.call(
                    self.transport.stub.RenewReadLease, request, timeout=max(interval, 1.0)
                )
            except ShardcacheError as exc:
                why = (
                    "the lease expired"
                    if isinstance(exc, LeaseNotFoundError)
                    else f"cannot renew it ({exc})"
                )
                log.warning(
                    "read lease on cache %r: %s; %s, and the next pass takes a new lease",
                    self.cache.name,
                    why,
                    lost,
                )
                return
            except ValueError:  # grpc: the CacheClient was closed while a pass held a lease
                log.debug(
                    "read lease on cache %r: the client is closed; not renewing", self.cache.name
                )
                return

    def release(self) -> None:
        """Stop renewing and end the lease on the daemon, once."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._released:
            return
        self._released = True
        try:
            self.transport.call(
                self.transport.stub.ReleaseReadLease,
                pb.ReleaseReadLeaseRequest(lease_id=self.granted.lease_id),
                timeout=5,
            )
        except (ShardcacheError, ValueError) as exc:  # ValueError: the client was closed
            log.debug(
                "could not release read lease %s (it expires on the daemon): %s",
                self.granted.lease_id,
                exc,
            )
