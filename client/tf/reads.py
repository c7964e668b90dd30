"""Checkpointable reads: a cache's epochs whose position lives in tf.data's own state.

A read position is an index into an immutable cache, so the Python side can be
pure given that index. One iteration of a cache's dataset is::

    control = from_tensors(0).map(numpy_function(begin))      # (epoch, start)
    control.flat_map(lambda epoch, start:                     # the iteration's batches
        from_tensors(0).flat_map(lambda _:
            hold, count = numpy_function(open, epoch, start)  # the epoch's chunks
            range(count).map(numpy_function(chunk, hold, i), deterministic=True)))

``flat_map`` saves the control element (epoch, start) and ``range`` the next
chunk's index: ``tf.train.Checkpoint(iterator=it)`` saves both, and a restored
iterator, in any process, rebuilds the inner dataset from the saved element
(``open`` runs again) and asks the chunks from the saved index on. A chunk's
batch is a function of its index alone (client/read/chunks.py); the elements
after unbatch (or ``rebatch``) do not depend on how they were cut.

With checkpoint, each iteration's ``unbatch`` (and a ``batch()``'s ``rebatch``)
runs inside its flat_map, so the flat_map holds the iteration until its last
element leaves it; restoring it runs ``open`` again, which moves the dataset's
epoch counter (plan.Epochs) past that epoch: the next iteration reads the next one.

The iteration's Python objects (the epoch's chunks, a write's state) are owned
by a *hold*: a small 64-byte-aligned array that ``begin``/``open`` return and
that TensorFlow keeps without a copy for as long as the iteration's iterator
lives (the flat_map's saved element, the inner dataset's captured input). A
``weakref.finalize`` on it closes the chunks (ending a read lease, cancelling
calls in flight), or cancels an unfinished write, when the iterator goes:
finished, stopped early, or replaced by a restore. A restored hold is a copy,
never one of ours, so it names nothing live here.

With checkpoint, the returned dataset sets
``experimental_external_state_policy=IGNORE``: the numpy_functions are stateful
only in the way of a cache (what they return is a function of the saved position).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import map_op

from client.format.fixed_decode import aligned_empty
from client.read.report import SAMPLE, Pace, ReadFigures
from client.tf.datasets import (
    BatchBuilder,
    CachedElements,
    IgnoringBuilder,
    declared,
    with_spec,
)
from client.tf.wire import Wire

log = logging.getLogger("client")

#: What each iteration's batches go through inside the iteration (unbatch, rebatch).
Transform = Callable[[tf.data.Dataset], tf.data.Dataset]
#: The chunks of epoch from position start (client/read/chunks.py's EpochChunks).
OpenChunks = Callable[[int, int], Any]
#: Threads of the pool that runs a read's chunk calls (at least): with chunks of
#: prefetch_bytes / 8, eight in flight hold about prefetch_bytes.
READ_THREADS = 8


def with_checkpoint_options(ds: tf.data.Dataset) -> tf.data.Dataset:
    """ds with the option its iterator's checkpoint needs (see the module docstring)."""
    options = tf.data.Options()
    options.experimental_external_state_policy = (
        tf.data.experimental.ExternalStatePolicy.IGNORE)
    return ds.with_options(options)


def new_hold(ident: int) -> np.ndarray:
    """A one-word array TensorFlow takes without a copy (aligned), holding ident."""
    hold = aligned_empty((1,), np.dtype(np.int64))
    hold[0] = ident
    return hold


class Ids:
    """Identifiers unique across processes: a restored hold never names a live one."""

    def __init__(self) -> None:
        self._count = itertools.count(secrets.randbits(62) + 1)

    def __next__(self) -> int:
        return next(self._count)


def quietly(close: Callable[[], None]) -> None:
    """Run a finalizer's close; it runs wherever the iterator happens to go, so log errors."""
    try:
        close()
    except Exception:
        log.warning("shardcache: closing a finished read failed", exc_info=True)


def own_threads(ds: tf.data.Dataset, threads: int) -> tf.data.Dataset:
    """ds computed on a thread pool of its own (tf.data's PrivateThreadPoolDataset): unlike
    Options.threading, which the elements' consumer would share, it covers ds alone."""
    variant = tf.raw_ops.PrivateThreadPoolDataset(
        input_dataset=tf.data.experimental.to_variant(ds), num_threads=threads,
        output_types=ds._flat_types, output_shapes=ds._flat_shapes)
    return tf.data.experimental.from_variant(variant, ds.element_spec)


class Reader:
    """The Python side of a checkpointable read: an epoch's chunks by hold, served by index.

    open_chunks(epoch, start) gives the chunks (client/read/chunks.py's
    EpochChunks) of epoch's share from position start; epochs is the dataset's
    plan.Epochs: a restored iterator at epoch e moves it to e + 1 (the next
    iteration reads the next epoch).
    """

    def __init__(self, wire: Wire, open_chunks: OpenChunks, epochs: Any, checkpoint: bool,
                 parallel: int = 0, figures: ReadFigures | None = None) -> None:
        self.wire = wire
        self._figures = figures  # what the read reports (client/read/report.py), if anything
        self.checkpoint = checkpoint
        self._open_chunks = open_chunks
        self._parallel = parallel or tf.data.AUTOTUNE
        # A chunk's call blocks on I/O (a daemon, a fleet member, the disk) for most of its
        # time: on tf.data's shared pool (one thread per core) at most that many would be
        # in flight, whatever num_parallel_calls says (docs/design.md, "Read threads").
        self._threads = max(parallel, READ_THREADS)
        self._epochs = epochs
        self._ids = Ids()
        self._lock = threading.Lock()
        self._live: dict[int, Any] = {}
        self._paces: dict[int, Pace] = {}

    def begin(self) -> tuple[np.int64, np.int64]:
        """numpy_function body of cc.dataset()'s control: this iteration's (epoch, start)."""
        epoch, start = self._epochs.take()
        return np.int64(epoch), np.int64(start)

    def open(self, epoch: np.int64, start: np.int64) -> tuple[np.ndarray, np.int64]:
        """numpy_function body run when an iteration's batches are built (or restored): the
        epoch's chunks from start, as (hold, chunk count)."""
        self._epochs.seen(int(epoch))
        chunks = self._open_chunks(int(epoch), int(start))
        ident = next(self._ids)
        hold = new_hold(ident)
        with self._lock:
            self._live[ident] = chunks
            if self._figures is not None:
                self._paces[ident] = Pace(self._figures)
        weakref.finalize(hold, self._drop, ident)
        return hold, np.int64(chunks.count)

    def _drop(self, ident: int) -> None:
        with self._lock:
            chunks = self._live.pop(ident, None)
            pace = self._paces.pop(ident, None)
        if pace is not None:
            pace.close()
        if chunks is not None:
            quietly(chunks.close)

    def chunk(self, hold: np.ndarray, i: np.int64) -> list[Any]:
        """numpy_function body: the arrays of chunk i (read.chunks.EpochChunks.chunk)."""
        with self._lock:
            chunks = self._live.get(int(hold[0]))
            pace = self._paces.get(int(hold[0]))
        if chunks is None:  # the iterator is gone; tf.data does not ask then
            raise RuntimeError(f"shardcache: no read is open for chunk {int(i)}")
        if pace is None:
            return self.wire.arrays(*chunks.chunk(int(i)))
        began = pace.now()
        n, batch = chunks.chunk(int(i))
        arrays = self.wire.arrays(n, batch)
        done = pace.now()
        pace.figures.chunk(getattr(chunks, "path", "mix"), n,
                           sum(getattr(a, "nbytes", 0) for a in arrays), done - began)
        pace.ready(int(i), done)
        return arrays

    def asked(self, hold: np.ndarray, i: np.int64, when: np.float64) -> np.int64:
        """numpy_function body, for every SAMPLE-th chunk once the consumer has it: it
        asked for chunk i at when."""
        with self._lock:
            pace = self._paces.get(int(hold[0]))
        if pace is not None:
            pace.asked(int(i), float(when))
        return i

    def options(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        return with_checkpoint_options(ds) if self.checkpoint else ds

    def batches(self, epoch: tf.Tensor, start: tf.Tensor) -> tf.data.Dataset:
        """The batches of epoch from start, in fmt.signature's form: range(count).map(chunk)
        with tf.data's parallelism, on a pool of the read's own, checkpointable as it is."""
        def chunks(_: tf.Tensor) -> tf.data.Dataset:  # opened once the batches are asked
            hold, count = tf.numpy_function(self.open, [epoch, start], [tf.int64, tf.int64],
                                            stateful=True)

            def chunk(i: tf.Tensor) -> Any:
                flat = tf.numpy_function(self.chunk, [hold, i], self.wire.dtypes,
                                         stateful=True)
                return self.wire.signature_of(flat)

            ds = tf.data.Dataset.range(count).map(chunk, num_parallel_calls=self._parallel,
                                                  deterministic=True)
            if self._figures is not None and self._figures.time_stall and not self.checkpoint:
                ds = self._timed(ds, hold, count)
            return own_threads(ds, self._threads)

        return tf.data.Dataset.from_tensors(np.int64(0)).flat_map(chunks)

    def _timed(self, ds: tf.data.Dataset, hold: tf.Tensor, count: tf.Tensor
               ) -> tf.data.Dataset:
        """ds (the chunks) with the consumer's asks timed: the input stall.

        zip asks its inputs in order: the ask for chunk i is timed (tf.timestamp) in the
        consumer's thread, before it waits on the chunk (client/read/report.py); every
        SAMPLE-th ask goes to Python once the chunk is here. Only where asked for
        (CacheClient(time_stall=True)): it costs a direct read of images 12-25% of its speed
        (docs/design.md). Inside the read's own thread pool: outside it, the zip alone costs
        a fifth. Not with checkpoint: a restore right after an epoch's last batch then reads
        that epoch again (tests/integration/test_checkpoints.py)."""
        # run on the consumer's own thread, not scheduled on the pool (busy with chunks):
        # there the ask would be timed once a chunk's call let go of a thread
        asks = map_op._MapDataset(tf.data.Dataset.range(count),
                                  lambda i: (i, tf.timestamp()),
                                  use_inter_op_parallelism=False)

        def handed(ask: tuple[tf.Tensor, tf.Tensor], batch: Any) -> Any:
            i, when = ask
            noted = tf.cond(i % SAMPLE == 0, lambda: tf.numpy_function(
                self.asked, [hold, i, when], tf.int64, stateful=True), lambda: i)
            with tf.control_dependencies([noted]):
                return tf.nest.map_structure(tf.identity, batch)

        return tf.data.Dataset.zip((asks, ds)).map(handed)

    def dataset(self, per_iteration: Transform) -> tf.data.Dataset:
        """cc.dataset()'s iterations, one epoch each, checkpointable: per_iteration of the
        batches (client/tf/reads.py's docstring says why inside the flat_map)."""
        @tf.autograph.experimental.do_not_convert
        def begin(_: tf.Tensor) -> tuple[tf.Tensor, ...]:
            return tuple(tf.numpy_function(self.begin, [], [tf.int64, tf.int64], stateful=True))

        @tf.autograph.experimental.do_not_convert  # and what it traces: plain TF ops
        def iteration(epoch: tf.Tensor, start: tf.Tensor) -> tf.data.Dataset:
            return per_iteration(self.batches(epoch, start))

        control = tf.data.Dataset.from_tensors(np.int64(0)).map(begin)
        return self.options(control.flat_map(iteration))


def elements(fmt: Any, iterations: Callable[[Transform], tf.data.Dataset],
             cardinality: int, checkpoint: bool, batched: BatchBuilder | None = None,
             ignoring: IgnoringBuilder | None = None) -> tf.data.Dataset:
    """fmt.elements() for a checkpointable dataset: iterations(per_iteration) builds it.

    The elements are unbatched, and batch(B)'s batches rebatched, inside each
    iteration's flat_map: an iteration whose last batches are still in a buffer
    of its own (the assembling map, a partial rebatch) keeps its flat_map alive,
    and a restore of it reruns open(), which moves the next iteration's epoch on.
    Without checkpoint, they run after it, as on fmt.elements(). batched and
    ignoring are fmt.elements()'s (a tapped cc.cache() gives its own).
    """
    if not checkpoint:
        return fmt.elements(iterations(lambda batches: batches), cardinality, batched, ignoring)
    ds = iterations(fmt.unbatched)
    if cardinality >= 0:
        ds = declared(ds, cardinality)
    ds = with_spec(ds, fmt.spec)
    if batched is None:
        def batched(size: int, drop_remainder: bool) -> tf.data.Dataset:
            return iterations(lambda batches: batches.rebatch(size,
                                                              drop_remainder=drop_remainder))
    return CachedElements(ds, batched if fmt.direct else None, cardinality, ignoring)
