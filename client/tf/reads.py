"""Checkpointable reads: a cache's epochs whose position lives in tf.data's own state.

A read position is an index into an immutable cache, so the Python side can be
pure given that index. One iteration of a cache's dataset is::

    control = from_tensors(0).map(numpy_function(begin))      # (epoch, start)
    control.flat_map(lambda epoch, start:                     # the iteration's batches
        hold, count = numpy_function(open, epoch, start)      # the epoch's chunks
        range(count).map(numpy_function(chunk, hold, i), deterministic=True))

``flat_map`` saves the control element (epoch, start) and ``range`` the next
chunk's index: ``tf.train.Checkpoint(iterator=it)`` saves both, and a restored
iterator, in any process, rebuilds the inner dataset from the saved element
(``open`` runs again) and asks the chunks from the saved index on. A chunk's
batch is a function of its index alone (client/read/assembly/chunks.py); the elements
after unbatch do not depend on how they were cut. Every
dataset is checkpointable: there is no other read path.

The numpy_functions are declared stateless: what each returns is a function
of its inputs and the immutable cache, as a file read by offset is
(``begin`` takes the control element as an input, so nothing folds it into a
constant). tf.data saves an iterator over them under its default external
state policy, and refuses, as for ``ds.cache()``, only a stateful function of
the user's own after the cache.

Restoring rebuilds the iteration from the saved (epoch, start), which runs
``seen`` in the flat_map's function: it moves the dataset's epoch counter
(plan.Epochs) past that epoch, and the next iteration reads the next one. So
the flat_map must still hold the iteration when its last element is delivered:
nothing between it and the consumer may ask it past the iteration's last
batch. The cardinality's ``take(n)`` (datasets.declared) never asks for
element n + 1, and ``unbatch`` asks for a batch only when its current one is
used up, so the elements of a cache of fixed-shape leaves are unbatched after
the flat_map, as tf.data's own ops and at their speed; what buffers or looks
ahead runs inside it (the assembling map of variable-shape caches, the
rebatch of a generated write epoch's batches, which asks past a short last
batch), and so does the unbatch of a dataset of unknown cardinality.

The iteration's Python objects (the epoch's chunks, a write's state) are owned
by a *hold*: a small 64-byte-aligned array that ``begin``/``open`` return and
that TensorFlow keeps without a copy for as long as the iteration's iterator
lives (the flat_map's saved element, the inner dataset's captured input). A
``weakref.finalize`` on it closes the chunks (ending a read lease, cancelling
calls in flight), or cancels an unfinished write, when the iterator goes:
finished, stopped early, or replaced by a restore. A restored hold is a copy:
in another process its number names nothing live, and in this one its
address is not the live hold's (``Holds.live``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from client.format.fixed_decode import aligned_empty
from client.observe.report import Pace, ReadFigures
from client.read.planning.shares import Batches
from client.tf.datasets import (
    BatchBuilder,
    CachedElements,
    IgnoringBuilder,
    declared,
    with_spec,
)
from client.tf.flat_arrays import FlatArrays

log = logging.getLogger("client")

#: What each iteration's batches go through inside the iteration (unbatch).
Transform = Callable[[tf.data.Dataset], tf.data.Dataset]
#: The chunks of epoch from position start (client/read/assembly/chunks.py's EpochChunks),
#: each a batch of the consumer's when Batches are given.
OpenChunks = Callable[[int, int, Batches | None], Any]
#: Threads of the pool that runs a read's chunk calls (at least): with chunks of
#: prefetch_bytes / 8, eight in flight hold about prefetch_bytes.
READ_THREADS = 8
#: A consumer's batches of a fixed-shape cache of at most half this many bytes are read
#: several to a chunk of about this many bytes (an unbatched read's chunk), and cut apart
#: by unbatch: each chunk's numpy_function call and tf.data's map around it cost ~0.2 ms,
#: more than unbatch's copy of a batch of up to ~2 MiB (docs/design.md, "Small batches:
#: several to a chunk").
GROUP_BYTES = 4 << 20


class Holds:
    """Live iterations' Python objects, by hold: what ``begin``/``open`` hand to TensorFlow.

    A hold's number is unique across processes (a random start), and the live
    hold is known by its buffer's address too: TensorFlow keeps the aligned
    array without a copy, so an input that is the live hold views that very
    buffer, while a restored one (a copy, in this process or another) does not.
    ``close(obj)`` runs when the live hold goes (finalizer, logged on error).
    """

    def __init__(self, close: Callable[[Any], None]) -> None:
        self._count = itertools.count(secrets.randbits(62) + 1)
        self._close = close
        self._lock = threading.Lock()
        self._live: dict[int, tuple[Any, int]] = {}

    def new(self, obj: Any) -> np.ndarray:
        """A hold owning obj: a one-word array TensorFlow takes without a copy."""
        hold = aligned_empty((1,), np.dtype(np.int64))
        ident = hold[0] = next(self._count)
        with self._lock:
            self._live[ident] = (obj, hold.ctypes.data)
        weakref.finalize(hold, self._drop, ident)
        return hold

    def live(self, hold: np.ndarray) -> Any:
        """The object hold owns; None for a restored hold, or once the iteration is gone."""
        with self._lock:
            return self._owned(hold)

    def pop(self, hold: np.ndarray) -> Any:
        """live(hold), no longer owned: its finalizer will not close it."""
        with self._lock:
            obj = self._owned(hold)
            if obj is not None:
                del self._live[int(hold[0])]
        return obj

    def _owned(self, hold: np.ndarray) -> Any:
        obj, address = self._live.get(int(hold[0]), (None, 0))
        return obj if hold.ctypes.data == address else None

    def _drop(self, ident: int) -> None:
        with self._lock:
            obj, _ = self._live.pop(ident, (None, 0))
        if obj is not None:
            quietly(lambda: self._close(obj))


def _close_read(read: tuple[Any, Pace | None]) -> None:
    chunks, pace = read
    if pace is not None:
        pace.close()
    chunks.close()


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
        input_dataset=tf.data.experimental.to_variant(ds),
        num_threads=threads,
        output_types=ds._flat_types,
        output_shapes=ds._flat_shapes,
    )
    return tf.data.experimental.from_variant(variant, ds.element_spec)


class Reader:
    """The Python side of a checkpointable read: an epoch's chunks by hold, served by index.

    open_chunks(epoch, start, batches) gives the chunks (client/read/assembly/chunks.py's
    EpochChunks) of epoch's share from position start, the consumer's batches themselves
    when batches (a ``batch()``'s size and drop_remainder) are given; epochs is the dataset's
    plan.Epochs: a restored iterator at epoch e moves it to e + 1 (the next
    iteration reads the next epoch).
    """

    def __init__(
        self,
        flat: FlatArrays,
        open_chunks: OpenChunks,
        epochs: Any,
        parallel: int = 0,
        figures: ReadFigures | None = None,
    ) -> None:
        self.flat = flat
        self._figures = figures  # what the read reports (client/observe/report.py), if anything
        self._open_chunks = open_chunks
        self._parallel = parallel or tf.data.AUTOTUNE
        # A chunk's call blocks on I/O (a daemon, a fleet member, the disk) for most of its
        # time: on tf.data's shared pool (one thread per core) at most that many would be
        # in flight, whatever num_parallel_calls says (docs/design.md, "Read threads").
        self._threads = max(parallel, READ_THREADS)
        self._epochs = epochs
        self._holds = Holds(_close_read)

    def begin(self, _: np.int64) -> tuple[np.int64, np.int64]:
        """numpy_function body of cc.dataset()'s control: this iteration's (epoch, start)."""
        epoch, start = self._epochs.take()
        return np.int64(epoch), np.int64(start)

    def seen(self, epoch: np.int64) -> np.int64:
        """numpy_function body run when an iteration is built, or rebuilt by a restore."""
        self._epochs.seen(int(epoch))
        return np.int64(0)

    def open(
        self,
        epoch: np.int64,
        start: np.int64,
        _after: np.int64,
        wanted: np.bool_,
        batches: Batches | None = None,
    ) -> tuple[np.ndarray, np.int64]:
        """numpy_function body run when an iteration is built (or restored): the epoch's
        chunks from start, as (hold, chunk count); none, and nothing opened, unless wanted
        (an iteration that writes or runs the source instead)."""
        if not wanted:
            return aligned_empty((1,), np.dtype(np.int64)), np.int64(0)
        chunks = self._open_chunks(int(epoch), int(start), batches)
        pace = Pace(self._figures) if self._figures is not None else None
        return self._holds.new((chunks, pace)), np.int64(chunks.count)

    def grouped(self, batches: Batches | None) -> Batches | None:
        """batches with the group its chunks hold: several when they are small batches of a
        fixed-shape cache (GROUP_BYTES)."""
        if batches is None or not self.flat.fixed:
            return batches
        group = GROUP_BYTES // max(batches.size * self.flat.fmt.layout.record_size, 1)
        return dataclasses.replace(batches, group=group) if group >= 2 else batches

    def group_chunk(self, hold: np.ndarray, i: np.int64, size: int) -> list[Any]:
        """numpy_function body: chunk i of a grouped read, each array shaped (batches,
        size, ...): its whole batches, or the short last one alone (shares.Batching)."""
        arrays = self.chunk(hold, i)
        n = len(arrays[0])
        shape = (n // size, size) if n >= size else (1, n)
        return [a.reshape(*shape, *a.shape[1:]) for a in arrays]

    def chunk(self, hold: np.ndarray, i: np.int64) -> list[Any]:
        """numpy_function body: the arrays of chunk i (read.chunks.EpochChunks.chunk)."""
        chunks, pace = self._holds.live(hold) or (None, None)
        if chunks is None:  # the iterator is gone; tf.data does not ask then
            raise RuntimeError(f"shardcache: no read is open for chunk {int(i)}")
        if pace is None:
            return self.flat.arrays(*chunks.chunk(int(i)))
        began = pace.now()
        n, batch = chunks.chunk(int(i))
        arrays = self.flat.arrays(n, batch)
        done = pace.now()
        pace.figures.chunk(
            getattr(chunks, "path", "mix"),
            n,
            sum(getattr(a, "nbytes", 0) for a in arrays),
            done - began,
        )
        return arrays

    def batches(
        self,
        epoch: tf.Tensor,
        start: tf.Tensor,
        after: Any = 0,
        batches: Batches | None = None,
        wanted: Any = True,
    ) -> tf.data.Dataset:
        """The batches of epoch from start, in fmt.signature's form: range(count).map(chunk)
        with tf.data's parallelism, on a pool of the read's own, checkpointable as it is.
        Built inside the iteration's flat_map function, which opens the chunks when it runs
        (no flat_map of its own: each costs its function's instantiation, with grappler,
        every epoch). after: an int64 scalar computed first (open takes it). wanted: a bool
        scalar, false for an iteration that reads nothing (none opened, no batches).
        batches: the consumer's batch(size, drop_remainder), each chunk one of them, or
        several small ones that unbatch then cuts apart (else chunks of about
        prefetch_bytes / 8)."""
        batches = self.grouped(batches)
        open_chunks = functools.partial(self.open, batches=batches)
        call: Callable[..., list[Any]] = self.chunk
        group = batches is not None and batches.group > 1
        if batches is not None and group:
            call = functools.partial(self.group_chunk, size=batches.size)
        hold, count = tf.numpy_function(
            open_chunks,
            [epoch, start, tf.cast(after, tf.int64), tf.cast(wanted, tf.bool)],
            [tf.int64, tf.int64],
            stateful=False,
        )

        def chunk(i: tf.Tensor) -> Any:
            flat = tf.numpy_function(call, [hold, i], self.flat.dtypes, stateful=False)
            return self.flat.signature_of(flat, lead=2 if group else 1)

        ds = tf.data.Dataset.range(count).map(
            chunk, num_parallel_calls=self._parallel, deterministic=True
        )
        ds = own_threads(ds, self._threads)
        return ds.unbatch() if group else ds

    def dataset(
        self, per_iteration: Transform = lambda ds: ds, batches: Batches | None = None
    ) -> tf.data.Dataset:
        """cc.dataset()'s iterations, one epoch each, checkpointable: per_iteration of the
        batches (client/tf/reads.py's docstring says what runs inside the flat_map), each
        one of the consumer's when batches are given."""

        @tf.autograph.experimental.do_not_convert
        def begin(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
            return tuple(tf.numpy_function(self.begin, [x], [tf.int64, tf.int64], stateful=False))

        @tf.autograph.experimental.do_not_convert  # and what it traces: plain TF ops
        def iteration(epoch: tf.Tensor, start: tf.Tensor) -> tf.data.Dataset:
            # runs when flat_map builds the iteration, and when a restore rebuilds it from
            # the saved (epoch, start), whatever its inner datasets had used up
            seen = tf.numpy_function(self.seen, [epoch], tf.int64, stateful=False)
            return per_iteration(self.batches(epoch, start, seen, batches))

        control = tf.data.Dataset.from_tensors(np.int64(0)).map(begin)
        return control.flat_map(iteration)


def elements(
    fmt: Any,
    iterations: Callable[..., tf.data.Dataset],
    cardinality: int,
    batched: BatchBuilder | None = None,
    ignoring: IgnoringBuilder | None = None,
) -> tf.data.Dataset:
    """The element dataset of a cache read: iterations(per_iteration) builds it, and
    iterations(batches=Batches(size, drop_remainder)) the iterations of its batch().

    The elements of a cache of fixed-shape leaves with a known cardinality are
    unbatched after the iterations' flat_map; the others inside each iteration.
    batch(B) reads the batches themselves: each chunk is one, decoded into arrays
    of its own (client/read/assembly/chunks.py). batched and ignoring are
    datasets.CachedElements' (a tapped cc.cache() gives its own).
    """
    outside = fmt.direct and cardinality >= 0
    ds = (
        iterations(fmt.unbatched)
        if not outside
        else fmt.unbatched(iterations(lambda batches: batches))
    )
    if cardinality >= 0:
        ds = declared(ds, cardinality)
    ds = with_spec(ds, fmt.spec)
    if batched is None:

        def batched(size: int, drop_remainder: bool) -> tf.data.Dataset:
            return iterations(batches=Batches(size, drop_remainder))

    if not fmt.direct:
        return ds if ignoring is None else CachedElements(ds, None, cardinality, ignoring)
    return CachedElements(ds, batched, cardinality, ignoring)
