"""Write-through with the source kept inside tf.data: a tap instead of from_generator.

The generator path (``DatasetBuilder._write_through``, client/tf/builder.py)
pulls the source's batches into Python and hands them back to TensorFlow
through ``from_generator``: on the ``jpeg`` pipeline that element path cost
+0.52 CPU s per 600 elements over the bare pipeline, tapped it costs +0.11
(docs/writing.md, "The tap"). Here the source stays in tf.data and only the
bytes to store leave it::

    control = numpy_function(Iterations.begin)   # TapEpochs.control's (token, mode), epoch, start
    control.flat_map(lambda hold, token, mode, epoch, start:
        finalized(source.batch(B)).map(tap(token)).take(-1 if mode == WRITE else 0)
        .concatenate(finalized(source.batch(B)).take(-1 if mode == SOURCE else 0))
        .concatenate(reader.batches(epoch, start, Batches(B)).take(-1 if mode == READ else 0)))

(``convert.tapped_batches`` builds it, client/tf/iterations.py runs the control;
``take(0)`` never starts its input.) B is
the size the consumer's ``batch()`` asks for (client/tf/datasets.py): the
tap sees the very batches the consumer gets, and a write epoch adds no copy.
The cache's elements, without ``batch()``, come from ~4 MiB batches
``unbatch``ed, the reads' decoded batches as they are.

The control generator makes the per-iteration choice when the iteration
starts, as the generator path does: begin a write (mode WRITE), read the
committed cache (READ), or run the source alone when the daemon refuses or is
down, or another process is writing (SOURCE). The tap is a ``numpy_function``
on each source batch that hands the batch (its tensors' buffers, no copy) to
the iteration's :class:`WriteBehind` and returns at once; it is declared
stateless, so that tf.data saves a write epoch with the source's own state, and
the tap of a restored iteration passes its batches through (client/tf/reads.py,
``Holds``): its write ended with the iterator that began it.
The tap that sees the source's last element commits the write, before that
batch goes on: the dataset declares its cardinality by ``take`` (datasets.declared),
which stops at the last element without asking for more. An iteration stopped
before the source's last element (break, ``take(n)``, Ctrl-C, an error)
destroys the iterator and with it the control generator, whose ``finally``
cancels the write (nothing is committed) and joins the write-behind thread.

A source error does not end a tf.data iteration: the batch that held it is
lost, and a loop that catches the error and asks again (``ignore_errors()``)
gets the batches after it. So a write commits only when the tap has seen exactly
the source's cardinality of elements; an iteration that ends short of it is
discarded (logged).
Only sources of known cardinality take this path; the others keep the
generator path, where a source error ends the generator for good. Sources with
variable-shape, ragged or sparse leaves are flattened and ``ragged_batch``ed
instead of ``batch``ed (convert._wire_batches), and the tap gets their batches
in the reads' flat form (flat_arrays.FlatArrays).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from client import settings
from client.format.layout import Layout
from client.write.stream import CacheWriter
from client.write.write_behind import WriteBehind

log = logging.getLogger("client")

#: What one iteration does; the control element's second component.
WRITE, SOURCE, READ = 0, 1, 2


def enabled() -> bool:
    """Whether cc.cache() taps batchable sources ($SHARDCACHE_WRITE_TAP, default on)."""
    return settings.WRITE_TAP.get()


@dataclass(frozen=True)
class Decision:
    """What an iteration of a cc.cache() dataset does, decided when it starts.

    WRITE carries the begun writer; READ and SOURCE none.
    """

    mode: int
    writer: CacheWriter | None = None


@dataclass
class _Iteration:
    behind: WriteBehind | None
    tapped: int = 0  # elements handed to behind
    committed: bool = False  # by the tap of the last element


def committed(behind: WriteBehind) -> None:
    """Send the rest of a whole source's elements and commit them (logged)."""
    if (cache := behind.finish()) is not None:
        log.info("cache %r committed: %d elements", cache.name, cache.num_elements)


class TapEpochs:
    """The Python side of a tapped cc.cache() dataset: one entry per live iteration.

    decide() runs at the start of every iteration (it may raise: the error
    reaches the epoch); iterations are told apart by a token, so two iterators
    over one dataset at once each have their own write or read.
    """

    def __init__(
        self,
        layout: Layout,
        decide: Callable[[], Decision],
        elements: int,
        unflatten: Callable[[list[np.ndarray]], tuple[int, list[Any]]],
    ) -> None:
        self._layout = layout
        self._unflatten = unflatten  # a batch's flat arrays -> (count, decoded batch)
        self._decide = decide
        self._elements = elements  # the source's cardinality: what a whole write holds
        self._tokens = itertools.count(1)
        self._live: dict[int, _Iteration] = {}

    def control(self) -> Iterator[tuple[np.int64, np.int64]]:
        """One iteration's control generator: decide, yield (token, mode), commit."""
        decision = self._decide()
        behind = WriteBehind(decision.writer, self._layout) if decision.writer else None
        token = next(self._tokens)
        iteration = self._live[token] = _Iteration(behind)
        try:
            yield np.int64(token), np.int64(decision.mode)
            # flat_map asks again once the iteration's batches are exhausted; a whole
            # source was committed by its last tap, unless it had no elements
            if behind is None or iteration.committed:
                return
            if iteration.tapped == self._elements:
                committed(behind)
            else:
                log.warning(
                    "the source pipeline ended after %d of its %d elements (an "
                    "error in it?); the cache is not written, the next epoch will "
                    "try again",
                    iteration.tapped,
                    self._elements,
                )
        finally:
            del self._live[token]
            if behind is not None:
                behind.close()  # an uncommitted write is cancelled; the thread is joined

    def tap(self, token: np.int64, *flat: np.ndarray) -> None:
        """Queue one source batch of a live iteration for writing; it passes on unchanged.

        The arrays (the batch's flat wire arrays, flat_arrays.FlatArrays) are views of its
        tensors (numpy_function does not copy them) and keep those alive until
        the write-behind thread drops them.
        """
        iteration = self._live.get(int(token))
        if iteration is not None and iteration.behind is not None:
            n, batch = self._unflatten(list(flat))
            iteration.behind.put(n, batch)  # raises a failed packing's error
            iteration.tapped += n
            if iteration.tapped == self._elements:  # the last batch: commit before it goes on
                iteration.committed = True
                committed(iteration.behind)
