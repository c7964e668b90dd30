"""Sets of an epoch's positions as runs, and how a worker's share of them is cut.

A set of positions of an epoch's order is a sorted tuple of disjoint runs
``(lo, hi)``: a worker's share ``((w*N//W, (w+1)*N//W),)``, or what an
interrupted split left unread, a few runs (one per old worker at most, fewer
where they touch). Splitting a set W ways gives worker w the positions at
offsets ``[w*U//W, (w+1)*U//W)`` of the set's U positions in order: shares
are disjoint, complete and differ in size by at most one, as for a whole epoch.

Pure Python: no numpy, no TensorFlow, no gRPC.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Any

from client.errors import InvalidArgumentError

#: Sorted, disjoint [lo, hi) runs of positions, none empty.
Runs = tuple[tuple[int, int], ...]


def size(runs: Runs) -> int:
    return sum(hi - lo for lo, hi in runs)


def skip(runs: Runs, count: int) -> Runs:
    """runs without their first count positions."""
    out = []
    for lo, hi in runs:
        if count >= hi - lo:
            count -= hi - lo
            continue
        out.append((lo + count, hi))
        count = 0
    return tuple(out)


def first(runs: Runs, count: int) -> Runs:
    """The first count positions of runs."""
    out = []
    for lo, hi in runs:
        if count <= 0:
            break
        out.append((lo, min(hi, lo + count)))
        count -= hi - lo
    return tuple(out)


def split(runs: Runs, worker_index: int, num_workers: int) -> Runs:
    """Worker worker_index's share of runs: offsets [w*U//W, (w+1)*U//W) of its U positions."""
    total = size(runs)
    lo = worker_index * total // num_workers
    hi = (worker_index + 1) * total // num_workers
    return first(skip(runs, lo), hi - lo)


def merged(runs: list[tuple[int, int]]) -> Runs:
    """runs sorted, empty ones dropped, touching ones joined (they must not overlap)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in runs if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            if lo < out[-1][1]:
                raise ValueError(f"runs overlap: {out[-1]} and {(lo, hi)}")
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def checked(value: Any, num_elements: int, what: str) -> Runs:
    """value (a ReadState's remaining, from JSON) as Runs of an epoch of num_elements."""
    try:
        runs = tuple((int(lo), int(hi)) for lo, hi in value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what} is not a list of [lo, hi) runs: {value!r}") from exc
    ok = all(0 <= lo < hi <= num_elements for lo, hi in runs) and all(
        a[1] < b[0] for a, b in itertools.pairwise(runs)
    )
    if not ok:
        raise InvalidArgumentError(
            f"{what} is not sorted disjoint runs of positions in [0, {num_elements}): "
            f"{list(runs)}; pass the state as the reads saved it"
        )
    return runs


class Chunking:
    """runs cut into chunks of at most per_chunk consecutive positions, numbered in order.

    A chunk never crosses from one run to the next: a run of the stored order
    stays one ascending read per chunk.
    """

    def __init__(self, runs: Runs, per_chunk: int) -> None:
        self._runs = runs
        self._per_chunk = per_chunk
        self._ends = list(itertools.accumulate(-(-(hi - lo) // per_chunk) for lo, hi in runs))
        self.count = self._ends[-1] if self._ends else 0

    def bounds(self, i: int) -> tuple[int, int]:
        """The positions [p0, p1) of chunk i."""
        k = bisect.bisect_right(self._ends, i)
        lo, hi = self._runs[k]
        p0 = lo + (i - (self._ends[k - 1] if k else 0)) * self._per_chunk
        return p0, min(p0 + self._per_chunk, hi)

    def pieces(self, i: int) -> list[tuple[int, int]]:
        """Chunk i's positions as Batching.pieces gives a batch's: one run."""
        return [self.bounds(i)]


@dataclass(frozen=True)
class Batches:
    """A consumer's batch(size, drop_remainder): the chunks of a read are its batches, group
    of them to a chunk (client/tf/reads.py groups small ones)."""

    size: int
    drop_remainder: bool = False
    group: int = 1


class Batching:
    """runs cut into batches of exactly batches.size consecutive positions of the share, the
    last one shorter (or dropped, with drop_remainder): chunk i is batches [i x group,
    (i + 1) x group) of the share, whole ones; the short last batch is a chunk of its own.

    A batch crosses from one run to the next where the share's runs meet (a resumed split
    leaves a few): it is then read in pieces, one per run, into one batch.
    """

    def __init__(self, runs: Runs, batches: Batches) -> None:
        self._runs = runs
        self._size = batches.size
        self._group = batches.group
        self._starts = list(itertools.accumulate((hi - lo for lo, hi in runs), initial=0))
        total = self._starts[-1]
        whole = total // self._size
        self._grouped = -(-whole // self._group)  # chunks of whole batches
        short = bool(total % self._size) and not batches.drop_remainder
        self.count = self._grouped + short

    def pieces(self, i: int) -> list[tuple[int, int]]:
        """The positions [p0, p1) of chunk i, one piece per run it touches, in order."""
        total = self._starts[-1]
        if i < self._grouped:
            at = i * self._group * self._size
            end = min(at + self._group * self._size, total - total % self._size)
        else:  # the short last batch
            at, end = total - total % self._size, total
        pieces = []
        k = bisect.bisect_right(self._starts, at) - 1
        while at < end:
            lo, hi = self._runs[k]
            p0 = lo + at - self._starts[k]
            p1 = min(hi, p0 + end - at)
            pieces.append((p0, p1))
            at += p1 - p0
            k += 1
        return pieces
