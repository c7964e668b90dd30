"""The readers of this daemon's caches, as they report themselves: /metrics per training job.

Each client process reports its readers every few seconds (ReportReads, client/observe/report.py):
per cache, the running totals of elements, bytes and chunks it handed to tf.data, the
seconds its chunks took to fetch and decode, and the seconds its training loop asked for an
element that was not ready yet (the input stall). :class:`Readers` keeps the latest report of each
and exports them at every scrape, one series per training job, rank, cache and path; two
processes reporting the same labels (a restarted rank) add up.

Bounded whatever the callers send: a reader not reported for ``EXPIRY_SECONDS`` is forgotten
(its series disappear), and past ``MAX_READERS`` readers the one reported longest ago is
dropped (counted in ``shardcache_readers_dropped_total``). The labels are ``training_job``,
``rank``, ``cache`` and ``path``: not ``job`` and ``instance``, which Prometheus attaches to
every scrape itself. The strings are checked at the edge (cacheserver/rpc/validate.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cacheserver import metrics

#: Readers kept at most; past it the one reported longest ago is dropped.
MAX_READERS = 256
#: A reader not reported for this long is forgotten (clients report every 5 s).
EXPIRY_SECONDS = 30.0
#: The ways a reader's chunks come (client/read/assembly/chunks.py).
PATHS = ("direct", "plane", "grpc", "fleet", "mix")
LABELS = ("training_job", "rank", "cache", "path")


class Labels(NamedTuple):
    training_job: str
    rank: str
    cache: str
    path: str


@dataclass(frozen=True)
class Figures:
    """One reader's running totals (counters) since its process began reading its cache."""

    elements: int = 0
    bytes: int = 0
    chunks: int = 0
    chunk_seconds: float = 0.0
    stall_seconds: float = 0.0

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            self.elements + other.elements,
            self.bytes + other.bytes,
            self.chunks + other.chunks,
            self.chunk_seconds + other.chunk_seconds,
            self.stall_seconds + other.stall_seconds,
        )


_FAMILIES: tuple[tuple[str, str, Callable[[Figures], float]], ...] = (
    (
        "shardcache_reader_elements",
        "Elements readers handed to tf.data, as they report it.",
        lambda f: f.elements,
    ),
    (
        "shardcache_reader_bytes",
        "Bytes of decoded chunks readers handed to tf.data.",
        lambda f: f.bytes,
    ),
    ("shardcache_reader_chunks", "Chunks readers handed to tf.data.", lambda f: f.chunks),
    (
        "shardcache_reader_chunk_seconds",
        "Seconds readers' chunks took to fetch and decode, summed over chunks (several are in "
        "flight at once).",
        lambda f: f.chunk_seconds,
    ),
    (
        "shardcache_reader_stall_seconds",
        "Seconds the readers' training loops asked for their next element before it was "
        "ready (cc.timed()): the input stall. Its rate is the fraction of time the loop waited "
        "on its input.",
        lambda f: f.stall_seconds,
    ),
)


class Readers(Collector):
    """The latest report of each reader, exported at every scrape (see the module docstring)."""

    def __init__(
        self,
        max_readers: int = MAX_READERS,
        expiry: float = EXPIRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_readers, self.expiry = max_readers, expiry
        self._clock = clock
        self._lock = threading.Lock()
        #: (reporter, labels) -> (when reported, figures), least recently reported first
        self._latest: OrderedDict[tuple[str, Labels], tuple[float, Figures]] = OrderedDict()

    def report(self, reporter: str, readers: Iterable[tuple[Labels, Figures]]) -> None:
        """Keep what one process reports (its strings already checked)."""
        now = self._clock()
        with self._lock:
            for labels, figures in readers:
                key = (reporter, labels)
                self._latest[key] = (now, figures)
                self._latest.move_to_end(key)
            self._expire(now)
            while len(self._latest) > self.max_readers:
                self._latest.popitem(last=False)
                metrics.READERS_DROPPED.inc()

    def live(self) -> dict[Labels, Figures]:
        """The readers reported within the expiry, summed by labels."""
        with self._lock:
            self._expire(self._clock())
            out: dict[Labels, Figures] = {}
            for (_, labels), (_, figures) in self._latest.items():
                out[labels] = out.get(labels, Figures()) + figures
            return out

    def _expire(self, now: float) -> None:  # under the lock
        while self._latest:
            key, (when, _) = next(iter(self._latest.items()))
            if now - when < self.expiry:
                return
            del self._latest[key]

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        live = self.live()
        yield GaugeMetricFamily(
            "shardcache_readers",
            "Readers reported within the expiry, by their labels.",
            value=len(live),
        )
        for name, doc, value in _FAMILIES:
            unit = name.rpartition("_")[2] if name.endswith(("_seconds", "_bytes")) else ""
            family = CounterMetricFamily(name, doc, labels=LABELS, unit=unit)
            for labels, figures in sorted(live.items()):
                family.add_metric(list(labels), value(figures))
            yield family


#: The daemon's readers, exported on /metrics with the other metrics.
READERS = Readers()
metrics.REGISTRY.register(READERS)
