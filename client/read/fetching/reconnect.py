"""Reconnecting: any fetch.Remote as a Fetcher that tries again while its daemon is away.

A try that fails with UNAVAILABLE (daemon restarted, connection dropped) is
tried again for the indices not yet received, with exponential backoff, until
``reconnect_timeout`` seconds pass without progress; the fingerprint travels
with every request, so a cache replaced meanwhile fails with
FingerprintMismatchError instead of mixing data. Everything received is
delivered, so the next undelivered index is the next one not received.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc

from client.errors import (
    ReconnectTimeoutError,
    ServerUnavailableError,
    ShardcacheError,
    from_rpc_error,
)
from client.read.fetching.fetch import Calls, Chunk, Closed, Indices, Land, Remote, shifted

log = logging.getLogger("client")
_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 2.0


class Reconnecting:
    """A Fetcher over a Remote that tries again, for what did not arrive, while the daemon
    is away; thread-safe."""

    def __init__(
        self, remote: Remote, calls: Calls, cache_name: str, reconnect_timeout: float
    ) -> None:
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

    def stream(
        self, indices: Indices, epoch_start: bool = False, land: Land | None = None
    ) -> Iterator[Chunk]:
        """The records at indices as chunks arrive, trying again on UNAVAILABLE.

        indices is an array of global indices, or a range (the stored order,
        never materialized). epoch_start: this request starts a pass (the daemon
        counts a hit, once). land: where the values may be received (fetch.Fetcher).
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
                    for position, count, lengths, data in request.attempt(
                        indices[got:], epoch_start, shifted(land, got)
                    ):
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
                        log.log(
                            self._remote.lost_level,
                            "lost cacheserver at %s while "
                            "reading cache %r (%s); reconnecting for up to %gs",
                            target,
                            self._name,
                            err.details(),
                            self._timeout,
                        )
                    left = self._timeout - (now - failing_since)
                    if left <= 0:
                        raise ReconnectTimeoutError(
                            f"lost cacheserver at {target} in the middle of "
                            f"reading cache {self._name!r} and could not reconnect "
                            f"within reconnect_timeout={self._timeout:g}s: start the daemon "
                            "again (the read resumes where it stopped if it is back in time) "
                            "or raise reconnect_timeout="
                        ) from err
                    closing.wait(min(delay, left))  # backoff; wakes at once on close
                    delay = min(delay * 2, _MAX_BACKOFF)
                    epoch_start = False  # the failed try was sent: its hit is counted
        finally:
            request.close()
