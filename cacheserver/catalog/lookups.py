"""Looking names up in the object store: one lookup in flight per name, answers kept briefly.

When a job starts, hundreds of readers ask one daemon at once for a cache only the
store holds; each asks twice (GetCache, then the read that pulls it). The store tier
(cacheserver/catalog/remote.py) looks each name up through :class:`Lookups`, so that
burst costs one GET of the manifest: the first asker fetches it, the others wait for
its answer (its error too), and the answer is kept ``LOOKUP_TTL_S`` seconds: a
manifest until the read that adopts it, a name the store lacks against readers asking
again. An error is never kept; a publish or a delete by this daemon forgets the name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from cacheserver.catalog.stored import StoredCache

#: How long an answer is kept. Long enough to cover a job start, whose readers ask
#: within a second or two of each other; short enough that a cache another daemon
#: publishes meanwhile is found a few seconds after its manifest appears (building and
#: uploading it took far longer than that).
LOOKUP_TTL_S = 5.0

Fetch = Callable[[str], StoredCache | None]


class Lookups:
    """The store's answer for a name (its manifest, or None): fetched once per burst."""

    def __init__(
        self, fetch: Fetch, ttl_s: float = LOOKUP_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fetch = fetch  # the GET of a name's manifest
        self._ttl_s, self._clock = ttl_s, clock
        self._lock = threading.Lock()
        self._flights: dict[str, Future[StoredCache | None]] = {}
        self._kept: dict[str, tuple[float, StoredCache | None]] = {}  # name -> (until, answer)

    def find(self, name: str) -> StoredCache | None:
        """The store's manifest of name, or None: a kept answer, the one being fetched, or
        a new fetch; its errors reach every caller waiting for it and are not kept."""
        with self._lock:
            now = self._clock()
            until, answer = self._kept.get(name, (0.0, None))
            if until > now:
                return answer
            flight = self._flights.get(name)
            if flight is None:
                flight = self._flights[name] = Future()
                leader = True
            else:
                leader = False
        if not leader:
            return flight.result()
        try:
            answer = self._fetch(name)
        except BaseException as exc:
            with self._lock:
                if self._flights.get(name) is flight:
                    del self._flights[name]
            flight.set_exception(exc)
            raise
        with self._lock:
            if self._flights.get(name) is flight:  # else forgotten meanwhile: not kept
                del self._flights[name]
                now = self._clock()
                self._kept = {n: kept for n, kept in self._kept.items() if kept[0] > now}
                self._kept[name] = (now + self._ttl_s, answer)
        flight.set_result(answer)
        return answer

    def forget(self, name: str) -> None:
        """The store changed under name (published or deleted here): the next find fetches.
        A fetch under way still answers its waiters, but its answer is not kept."""
        with self._lock:
            self._kept.pop(name, None)
            self._flights.pop(name, None)
