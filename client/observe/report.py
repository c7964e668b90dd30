"""What this process's readers tell their daemon: per cache, how much they read and how long
the training loop waited (ReportReads; the daemon side is cacheserver/reader_reports.py).

A read (an iteration of ``cc.dataset()`` or of a READY ``cc.cache()``) counts, per chunk it
hands to tf.data, the chunk's elements and decoded bytes and the seconds it took to fetch
and decode (:meth:`ReadFigures.chunk`), under one short lock: nothing per element. The
**input stall**, how long the training loop asked for its next element before it was
ready, is timed at the top of the loop's pipeline, where ``cc.timed(ds)`` puts it
(client/tf/stall.py): :meth:`Reports.stalled` adds it to this process's total (what
:class:`InputStall` reads) and to the figures of every cache whose reads are alive.

:class:`Reports` sends every reader's running totals to its cache's daemon every
``REPORT_SECONDS`` from one thread per CacheClient while any of its iterations is alive,
and once more when the last ends or the client closes; the labels are
the training job and rank (``CacheClient(job=, rank=)``, else ``$SHARDCACHE_JOB`` and
``$SHARDCACHE_RANK``, else the program's name and ``TF_CONFIG``'s task index, else 0).
A failed report (a daemon down, or one without ReportReads) is logged once per daemon and
sent again at the next; reading goes on regardless.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from client import settings
from client._transport import Transport, pb
from client.errors import InvalidArgumentError, ShardcacheError
from client.wire.limits import LABEL_PATTERN, MAX_RANK, MAX_REPORTED_READERS

log = logging.getLogger("client")
T = TypeVar("T")

REPORT_SECONDS = 5.0
_LABEL = re.compile(LABEL_PATTERN)


def check_job(job: str) -> str:
    if not _LABEL.fullmatch(job):
        raise InvalidArgumentError(
            f"job {job!r} must be 1-64 of A-Z a-z 0-9 _ . - "
            f"(CacheClient(job=...) or ${settings.JOB.name})"
        )
    return job


def default_job() -> str:
    """$SHARDCACHE_JOB, else the program's name (a script's, or the package's run with
    python -m; characters outside the label's set replaced by -), else "python"."""
    job = settings.JOB.get()
    if job is not None:
        return job
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    program = program.parent if program.stem == "__main__" else program  # python -m NAME
    return re.sub(r"[^A-Za-z0-9_.-]", "-", program.stem)[:64].strip("-") or "python"


def default_rank() -> int:
    """$SHARDCACHE_RANK, else TF_CONFIG's task index (a multi-worker job's), else 0."""
    rank = settings.RANK.get()
    if rank is not None:
        return rank
    try:  # TF's own variable, not a shardcache setting
        return check_rank(int(json.loads(os.environ.get("TF_CONFIG", "{}"))["task"]["index"]))
    except (ValueError, KeyError, TypeError):
        return 0


def check_rank(rank: int) -> int:
    if not 0 <= rank <= MAX_RANK:
        raise InvalidArgumentError(f"rank {rank} must be between 0 and {MAX_RANK}")
    return rank


class ReadFigures:
    """One cache's running totals in this process (counters); thread-safe, per chunk."""

    def __init__(self, cache: str, reports: Reports | None = None) -> None:
        self.cache = cache
        self.reports = reports
        self.path = "grpc"
        self.elements = self.bytes = self.chunks = 0
        self.live = 0  # its iterations alive (Pace): the loop's stall is theirs meanwhile
        self.chunk_seconds = self.stall_seconds = 0.0
        self._lock = threading.Lock()

    def chunk(self, path: str, elements: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.path = path
            self.elements += elements
            self.bytes += nbytes
            self.chunks += 1
            self.chunk_seconds += seconds

    def stalled(self, seconds: float) -> None:
        with self._lock:
            self.stall_seconds += seconds

    def began(self) -> None:
        """An iteration of this cache's reads started (Pace)."""
        with self._lock:
            self.live += 1
        if self.reports is not None:
            self.reports.began()

    def ended(self) -> None:
        with self._lock:
            self.live -= 1
        if self.reports is not None:
            self.reports.ended()

    def proto(self, job: str, rank: int) -> pb.ReaderFigures:
        with self._lock:
            return pb.ReaderFigures(
                training_job=job,
                rank=rank,
                cache=self.cache,
                path=self.path,
                elements=self.elements,
                bytes=self.bytes,
                chunks=self.chunks,
                chunk_seconds=self.chunk_seconds,
                stall_seconds=self.stall_seconds,
            )


class _ProcessStall:
    """Seconds the training loops of this process waited on the datasets cc.timed() wraps,
    since it started."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.timed = False  # whether any dataset's waits are timed (cc.timed())
        self._lock = threading.Lock()

    def stalled(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


_PROCESS = _ProcessStall()


class InputStall:
    """How much of the time the training loop waited on its input.

    For a custom training loop (Keras: client.InputStallCallback)::

        stall = client.InputStall()
        for step, batch in enumerate(cc.timed(ds)):
            train_step(batch)
            if step % 100 == 99:
                print(f"waiting on input {stall.fraction():.0%}")

    :meth:`fraction` is the share of the wall time since the previous call (or since
    the meter was made) spent waiting on input: near 1, the loop waits on its input; near
    0, the input keeps ahead. It counts the waits of every dataset of this process that
    ``cc.timed()`` wraps; a loop over any other iterable (cc.numpy(), a PyTorch
    DataLoader) times its own ``next()`` calls through :meth:`timed`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waited = 0.0  # in timed()'s next()
        self._timed = False
        self._when, self._stalled = clock(), self._total()

    def _total(self) -> float:
        return self._waited if self._timed else _PROCESS.seconds

    def timed(self, iterable: Iterable[T]) -> Iterator[T]:
        """iterable's items, each next() timed: fraction() is then the loop's own wait."""
        if not self._timed:
            self._timed, self._stalled = True, 0.0
        it = iter(iterable)
        while True:
            asked = self._clock()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                self._waited += self._clock() - asked
            yield item

    def lap(self) -> tuple[float, float]:
        """(seconds waited, wall seconds) since the previous call, and start a new lap."""
        now, stalled = self._clock(), self._total()
        lap = (stalled - self._stalled, now - self._when)
        self._when, self._stalled = now, stalled
        return lap

    @property
    def measured(self) -> bool:
        """Whether fraction() measures anything: timed() was used, or a read timed its stall."""
        return self._timed or _PROCESS.timed

    def fraction(self) -> float:
        """The share of the wall time since the previous call spent waiting, 0 to 1."""
        waited, wall = self.lap()
        return min(1.0, waited / wall) if wall > 0 else 0.0


class Pace:
    """One iteration of a cache's reads: alive from open to close (the loop's stall is its
    cache's meanwhile), and the clock its chunks are timed by."""

    def __init__(self, figures: ReadFigures, clock: Callable[[], float] = time.monotonic) -> None:
        self.figures = figures
        self._clock = clock
        figures.began()

    def close(self) -> None:
        """The iteration ended (its iterator went)."""
        self.figures.ended()

    def now(self) -> float:
        return self._clock()


def stalled(seconds: float, reports: Reports | None = None) -> None:
    """The training loop waited seconds on input (client/tf/stall.py): this process's total,
    and, with reports, the figures of every cache whose reads are alive."""
    _PROCESS.stalled(seconds)
    if reports is not None:
        reports.stalled(seconds)


def timing() -> None:
    """A dataset's waits are timed in this process (InputStall.measured)."""
    _PROCESS.timed = True


class Reports:
    """A CacheClient's readers' figures, sent to each cache's daemon every REPORT_SECONDS."""

    def __init__(
        self, job: str, rank: int, home: Callable[[str], Transport], every: float = REPORT_SECONDS
    ) -> None:
        self.job, self.rank = job, rank
        self.reporter = secrets.token_hex(8)
        self._home, self._every = home, every
        self._lock = threading.Condition()
        self._figures: dict[str, ReadFigures] = {}
        self._warned: set[str] = set()
        self._open = 0  # iterations alive: the thread runs while there are any
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def make(cls, job: str | None, rank: int | None, home: Callable[[str], Transport]) -> Reports:
        """CacheClient's: job and rank checked, or their defaults."""
        return cls(
            check_job(job) if job is not None else default_job(),
            check_rank(rank) if rank is not None else default_rank(),
            home,
        )

    def reader(self, cache: str) -> ReadFigures:
        """The figures of cache in this process (made on first use)."""
        with self._lock:
            figures = self._figures.get(cache)
            if figures is None:
                figures = self._figures[cache] = ReadFigures(cache, self)
            return figures

    def stalled(self, seconds: float) -> None:
        """The loop waited seconds: the stall of every cache whose reads are alive."""
        with self._lock:
            figures = list(self._figures.values())
        for f in figures:
            if f.live > 0:
                f.stalled(seconds)

    def began(self) -> None:
        """An iteration started: report every REPORT_SECONDS while any is alive."""
        with self._lock:
            self._open += 1
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="shardcache-report"
                )
                self._thread.start()

    def ended(self) -> None:
        """An iteration ended: the last one's figures are reported at once."""
        with self._lock:
            self._open -= 1
            self._lock.notify_all()

    def send(self) -> None:
        """Report every reader now, one request per daemon."""
        with self._lock:
            figures = list(self._figures.values())
        by_daemon: dict[str, tuple[Transport, list[pb.ReaderFigures]]] = {}
        for f in figures:
            transport = self._home(f.cache)
            by_daemon.setdefault(transport.target, (transport, []))[1].append(
                f.proto(self.job, self.rank)
            )
        for target, (transport, readers) in by_daemon.items():
            for i in range(0, len(readers), MAX_REPORTED_READERS):
                request = pb.ReportReadsRequest(
                    reporter=self.reporter, readers=readers[i : i + MAX_REPORTED_READERS]
                )
                try:
                    transport.call(transport.stub.ReportReads, request, timeout=5)
                except ShardcacheError as exc:
                    if target not in self._warned:
                        self._warned.add(target)
                        log.warning(
                            "shardcache: could not report reads to %s (%s); retrying every %gs",
                            target,
                            exc,
                            self._every,
                        )
                    break

    def _loop(self) -> None:
        """Report every REPORT_SECONDS; once no iteration is alive, report and end."""
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._open <= 0 or self._closed, self._every)
            self.send()
            with self._lock:
                if self._open <= 0 or self._closed:
                    self._thread = None
                    return

    def close(self) -> None:
        """Stop reporting, once the figures of the iterations alive are sent."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
