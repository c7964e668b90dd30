"""Checkpointable reads: a cache's epochs whose position lives in tf.data's own state.

A read position is an index into an immutable cache, so the Python side can be
pure given that index. One iteration of a cache's dataset is::

    control = from_tensors(0).map(numpy_function(begin))     # (hold, mode, epoch, start, ...)
    control.flat_map(lambda hold, mode, epoch, start, ...:   # the iteration's batches
        ticks.scan(start, lambda p, _: fetch(open(epoch), p) -> p + n, batch)
             .take_while(batch not empty))

``flat_map`` saves the control element (epoch, start, mode) and ``scan`` saves the
position p: ``tf.train.Checkpoint(iterator=it)`` saves both, and a restored
iterator, in any process, rebuilds the inner dataset from the saved element
(``open(epoch)`` runs again) and asks ``fetch(p)``. ``fetch`` serves the batch at p
from the stream it already runs (client/read/streams.py: prefetch, reconnect,
byte-bounded memory, unchanged) when p is where that stream stands, and otherwise
starts the stream again at p. The batches are the stream's decoded batches, of any
size: the elements after unbatch (or ``rebatch``) do not depend on how they were cut.

Each iteration's ``unbatch`` (and a ``batch()``'s ``rebatch``) runs inside its
flat_map, so the flat_map holds the iteration until its last element leaves it;
restoring it runs ``open(epoch)`` again, which moves the dataset's epoch counter
(plan.Epochs) past that epoch: the next iteration reads the next one.

The iteration's Python objects (the stream, a write's state) are owned by a
*hold*: a small 64-byte-aligned array that ``begin``/``open`` return and that
TensorFlow keeps without a copy for as long as the iteration's iterator lives (the
flat_map's saved element, the inner dataset's captured input). A
``weakref.finalize`` on it closes the stream, or cancels an unfinished write, when
the iterator goes: finished, stopped early, or replaced by a restore. A restored
hold is a copy, never one of ours, so it names nothing live here.

The returned dataset sets ``experimental_external_state_policy=IGNORE``: the
numpy_functions are stateful only in the way of a cache (what they return is a
function of the saved position).
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from client.format.codec import VarLeaf
from client.format.fixed_decode import aligned_empty
from client.tf.datasets import (
    BatchBuilder,
    CachedElements,
    IgnoringBuilder,
    declared,
    with_spec,
)
from client.tf.tap import READ

log = logging.getLogger("client")

#: What each iteration's batches go through inside the iteration (unbatch, rebatch).
Transform = Callable[[tf.data.Dataset], tf.data.Dataset]
#: Batches of (count, decoded batch) from position start of epoch.
OpenEpoch = Callable[[int, int], Iterator[tuple[int, list[Any]]]]
#: The chunks of epoch from position start (client/read/chunks.py's EpochChunks).
OpenChunks = Callable[[int, int], Any]
#: "0" reads through the stream reader (client/read/streams.py) instead of chunks.
CHUNKS_ENV = "SHARDCACHE_READ_CHUNKS"


def chunked_reads() -> bool:
    """Whether reads go by chunks in tf.data's threads ($SHARDCACHE_READ_CHUNKS, default on)."""
    return os.environ.get(CHUNKS_ENV, "1") != "0"
_FIXED, _VAR, _EMPTY = "fixed", "var", "empty"


def with_checkpoint_options(ds: tf.data.Dataset) -> tf.data.Dataset:
    """ds with the option its iterator's checkpoint needs (see the module docstring)."""
    options = tf.data.Options()
    options.experimental_external_state_policy = (
        tf.data.experimental.ExternalStatePolicy.IGNORE)
    return ds.with_options(options)


def _hold(ident: int) -> np.ndarray:
    """A one-word array TensorFlow takes without a copy (aligned), holding ident."""
    hold = aligned_empty((1,), np.dtype(np.int64))
    hold[0] = ident
    return hold


class _Ids:
    """Identifiers unique across processes: a restored hold never names a live one."""

    def __init__(self) -> None:
        self._count = itertools.count(secrets.randbits(62) + 1)

    def __next__(self) -> int:
        return next(self._count)


@dataclass
class _Stream:
    """One iteration's read of one epoch: the running stream and where it stands."""

    epoch: int
    batches: Iterator[tuple[int, list[Any]]] | None = None
    next: int = -1  # the position the stream's next batch starts at
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        batches, self.batches = self.batches, None
        if batches is not None:
            batches.close()  # type: ignore[attr-defined]  # a generator: ends the pass


def _quietly(close: Callable[[], None]) -> None:
    """Run a finalizer's close; it runs wherever the iterator happens to go, so log errors."""
    try:
        close()
    except Exception:
        log.warning("shardcache: closing a finished read failed", exc_info=True)


class Wire:
    """A cache's decoded batches as flat numpy arrays and back, in from_generator's form.

    numpy_function returns flat tensors; ``arrays`` flattens a decoded batch
    (codec.decode_batch's form), ``signature_of`` rebuilds fmt.signature's
    structure in TF (variable-shape leaves as the ragged pairs to_wire makes).
    """

    def __init__(self, fmt: Any) -> None:
        self.fmt = fmt
        self.dtypes: list[tf.DType] = []
        self._empty: list[np.ndarray] = []
        self._count = -1  # a flat array with one row per element
        for leaf, kind in zip(fmt.layout.leaves, fmt.kinds):
            dtype = tf.as_dtype(leaf.dtype)
            if kind != _EMPTY and self._count < 0:
                self._count = len(self.dtypes) + (kind == _VAR)  # a fixed leaf, or sizes
            if kind == _FIXED:
                self.dtypes.append(dtype)
                self._empty.append(np.zeros((0, *leaf.shape), dtype.as_numpy_dtype))
            elif kind == _VAR:
                self.dtypes += [dtype, tf.int64, tf.int64, tf.int64]
                self._empty += [np.zeros(0, dtype.as_numpy_dtype)] + [np.zeros(0, np.int64)] * 3
        self._dummy = not self.dtypes
        if self._dummy:
            self._count = 0
            self.dtypes.append(tf.uint8)
            self._empty.append(np.zeros(0, np.uint8))

    def arrays(self, n: int, batch: list[Any]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for kind, leaf in zip(self.fmt.kinds, batch):
            if kind == _FIXED:
                out.append(leaf)
            elif kind == _VAR:
                assert isinstance(leaf, VarLeaf)
                out += [leaf.values, leaf.sizes, leaf.dims, leaf.ranks]
        if self._dummy:
            out.append(np.zeros(n, np.uint8))
        return out

    def batch(self, flat: list[np.ndarray]) -> tuple[int, list[Any]]:
        """arrays()'s inverse: (count, the decoded batch) of a batch's flat arrays."""
        n = len(flat[self._count])
        it = iter(flat)
        batch: list[Any] = []
        for kind, leaf in zip(self.fmt.kinds, self.fmt.layout.leaves):
            if kind == _FIXED:
                batch.append(next(it))
            elif kind == _VAR:
                batch.append(VarLeaf(next(it), next(it), next(it), next(it)))
            else:
                batch.append(np.zeros((n, *leaf.shape), tf.as_dtype(leaf.dtype).as_numpy_dtype))
        return n, batch

    def flat_of(self, batch: Any) -> list[tf.Tensor]:
        """signature_of()'s inverse: the flat tensors of a batch in fmt.signature's form."""
        parts = tf.nest.flatten(batch)
        if self.fmt.direct:
            return parts
        flat: list[tf.Tensor] = []
        for part in parts:
            if isinstance(part, tf.RaggedTensor):
                flat += [part.flat_values, part.row_lengths()]
            else:
                flat.append(part)
        return flat

    def empty(self) -> list[np.ndarray]:
        return list(self._empty)

    def count(self, flat: list[tf.Tensor]) -> tf.Tensor:
        """The elements in a batch of flat arrays (int64)."""
        return tf.shape(flat[self._count], out_type=tf.int64)[0]

    def signature_of(self, flat: list[tf.Tensor]) -> Any:
        it = iter(flat)
        parts: list[Any] = []

        def shaped(tensor: tf.Tensor, shape: tuple[Any, ...]) -> tf.Tensor:
            tensor.set_shape(shape)  # numpy_function's outputs have none; no op at run time
            return tensor

        for kind, leaf in zip(self.fmt.kinds, self.fmt.layout.leaves):
            if kind == _FIXED:
                parts.append(shaped(next(it), (None, *leaf.shape)))
            elif kind == _VAR:
                values, sizes, dims, ranks = (shaped(next(it), (None,)) for _ in range(4))
                parts.append(tf.RaggedTensor.from_row_lengths(values, sizes, validate=False))
                parts.append(tf.RaggedTensor.from_row_lengths(dims, ranks, validate=False))
        if self._dummy:
            parts.append(shaped(next(it), (None,)))
        if self.fmt.direct:
            return tf.nest.pack_sequence_as(self.fmt.signature, parts)
        return tuple(parts)


#: Threads of the pool that runs a read's chunk calls (at least): with chunks of
#: prefetch_bytes / 8, eight in flight hold about prefetch_bytes.
READ_THREADS = 8


def own_threads(ds: tf.data.Dataset, threads: int) -> tf.data.Dataset:
    """ds computed on a thread pool of its own (tf.data's PrivateThreadPoolDataset): unlike
    Options.threading, which the elements' consumer would share, it covers ds alone."""
    variant = tf.raw_ops.PrivateThreadPoolDataset(
        input_dataset=tf.data.experimental.to_variant(ds), num_threads=threads,
        output_types=ds._flat_types, output_shapes=ds._flat_shapes)
    return tf.data.experimental.from_variant(variant, ds.element_spec)


class Reader:
    """The Python side of a checkpointable read: streams by hold, served by position.

    open_epoch(epoch, start) starts a stream of (count, batch) at position start
    of epoch's share; epochs is the dataset's plan.Epochs: a restored iterator
    at epoch e moves it to e + 1 (the next iteration reads the next epoch).
    """

    def __init__(self, wire: Wire, open_epoch: OpenEpoch, epochs: Any, checkpoint: bool,
                 open_chunks: OpenChunks | None = None, parallel: int = 0) -> None:
        self.wire = wire
        self.checkpoint = checkpoint
        self._open_epoch = open_epoch
        self._open_chunks = open_chunks if chunked_reads() else None
        self._parallel = parallel or tf.data.AUTOTUNE
        # A chunk's call blocks on I/O (a daemon, a fleet member, the disk) for most of its
        # time: on tf.data's shared pool (one thread per core) at most that many would be
        # in flight, whatever num_parallel_calls says (docs/design.md, "Read threads").
        self._threads = max(parallel, READ_THREADS)
        self._epochs = epochs
        self._ids = _Ids()
        self._lock = threading.Lock()
        self._live: dict[int, _Stream] = {}
        self._chunked: dict[int, Any] = {}

    def begin(self) -> tuple[np.int64, np.int64]:
        """numpy_function body of cc.dataset()'s control: this iteration's (epoch, start)."""
        epoch, start = self._epochs.take()
        return np.int64(epoch), np.int64(start)

    def open(self, epoch: np.int64) -> np.ndarray:
        """numpy_function body run when an iteration's batches are built (or restored)."""
        self._epochs.seen(int(epoch))
        ident = next(self._ids)
        stream = _Stream(int(epoch))
        hold = _hold(ident)
        with self._lock:
            self._live[ident] = stream
        weakref.finalize(hold, self._drop, ident)
        return hold

    def _drop(self, ident: int) -> None:
        with self._lock:
            stream = self._live.pop(ident, None)
        if stream is not None:
            with stream.lock:
                _quietly(stream.close)

    def fetch(self, hold: np.ndarray, position: np.int64) -> list[Any]:
        """numpy_function body: the arrays of the batch at position (no elements: the end)."""
        p = int(position)
        with self._lock:
            stream = self._live.get(int(hold[0]))
        if stream is None:  # the iterator is gone; tf.data does not ask then
            raise RuntimeError(f"shardcache: no read is open for position {p}")
        with stream.lock:
            if stream.batches is None or stream.next != p:
                if stream.batches is not None:
                    log.debug("repositioning the read of epoch %d from %d to %d",
                              stream.epoch, stream.next, p)
                stream.close()
                stream.batches = self._open_epoch(stream.epoch, p)
                stream.next = p
            got = next(stream.batches, None)
            if got is None:
                stream.close()
                return self.wire.empty()
            n, batch = got
            stream.next += n
            return self.wire.arrays(n, batch)

    def options(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        return with_checkpoint_options(ds) if self.checkpoint else ds

    def generate(self, epoch: np.int64, start: np.int64) -> Iterator[Any]:
        """from_generator body: the batches of epoch from start (checkpoint=False)."""
        for n, batch in self._open_epoch(int(epoch), int(start)):
            yield self.wire.fmt.to_wire(batch, n)

    def open_chunked(self, epoch: np.int64, start: np.int64) -> tuple[np.ndarray, np.int64]:
        """numpy_function body: the epoch's chunks from start, as (hold, chunk count)."""
        self._epochs.seen(int(epoch))
        chunks = self._open_chunks(int(epoch), int(start))  # type: ignore[misc]
        ident = next(self._ids)
        hold = _hold(ident)
        with self._lock:
            self._chunked[ident] = chunks
        weakref.finalize(hold, self._drop_chunked, ident)
        return hold, np.int64(chunks.count)

    def _drop_chunked(self, ident: int) -> None:
        with self._lock:
            chunks = self._chunked.pop(ident, None)
        if chunks is not None:
            _quietly(chunks.close)

    def chunk(self, hold: np.ndarray, i: np.int64) -> list[Any]:
        """numpy_function body: the arrays of chunk i (read.chunks.EpochChunks.chunk)."""
        with self._lock:
            chunks = self._chunked.get(int(hold[0]))
        if chunks is None:  # the iterator is gone; tf.data does not ask then
            raise RuntimeError(f"shardcache: no read is open for chunk {int(i)}")
        return self.wire.arrays(*chunks.chunk(int(i)))

    def batches(self, epoch: tf.Tensor, start: tf.Tensor) -> tf.data.Dataset:
        """The batches of epoch from start, in fmt.signature's form.

        Chunked (client/read/chunks.py): range(count).map(chunk) with tf.data's
        parallelism, checkpointable as it is. Otherwise the stream reader's
        batches: checkpointable with checkpoint (a scan over positions), else one
        from_generator yield per batch.
        """
        if self._open_chunks is not None:
            def chunks(_: tf.Tensor) -> tf.data.Dataset:  # opened once the batches are asked
                hold, count = tf.numpy_function(self.open_chunked, [epoch, start],
                                                [tf.int64, tf.int64], stateful=True)

                def chunk(i: tf.Tensor) -> Any:
                    flat = tf.numpy_function(self.chunk, [hold, i], self.wire.dtypes,
                                             stateful=True)
                    return self.wire.signature_of(flat)

                return own_threads(tf.data.Dataset.range(count).map(
                    chunk, num_parallel_calls=self._parallel, deterministic=True),
                    self._threads)

            return tf.data.Dataset.from_tensors(np.int64(0)).flat_map(chunks)
        if not self.checkpoint:
            return tf.data.Dataset.from_generator(self.generate, args=(epoch, start),
                                                  output_signature=self.wire.fmt.signature)
        hold = tf.numpy_function(self.open, [epoch], tf.int64, stateful=True)

        def step(p: tf.Tensor, _: tf.Tensor) -> tuple[tf.Tensor, Any]:
            flat = tf.numpy_function(self.fetch, [hold, p], self.wire.dtypes, stateful=True)
            return p + self.wire.count(flat), self.wire.signature_of(flat)

        def more(*batch: Any) -> tf.Tensor:  # an empty batch ends the epoch
            first = tf.nest.flatten(batch)[0]
            if isinstance(first, tf.RaggedTensor):
                return first.nrows(out_type=tf.int64) > 0
            return tf.shape(first, out_type=tf.int64)[0] > 0

        ticks = tf.data.Dataset.from_tensors(np.int64(0)).repeat()
        return ticks.scan(tf.cast(start, tf.int64), step).take_while(more)

    def dataset(self, per_iteration: Transform) -> tf.data.Dataset:
        """cc.dataset()'s iterations, one epoch each, checkpointable: per_iteration of the
        batches (client/tf/reads.py's docstring says why inside the flat_map)."""
        control = tf.data.Dataset.from_tensors(np.int64(0)).map(
            lambda _: tuple(tf.numpy_function(self.begin, [], [tf.int64, tf.int64],
                                              stateful=True)))
        return self.options(control.flat_map(
            lambda epoch, start: per_iteration(self.batches(epoch, start))))


class Iterations:
    """The Python side of cc.cache()'s control: what each iteration does, by hold.

    control() is tap.TapEpochs.control (or the generator path's twin): a
    generator that decides, yields (token, mode) once, and commits a write when
    asked again; closing it early cancels the write. begin() runs it up to its
    yield, finish() asks again (after the iteration's batches), and the hold's
    finalizer closes it however the iteration ends.
    """

    def __init__(self, reader: Reader, epochs: Any, options: tf.data.Options) -> None:
        self.reader = reader
        self._epochs = epochs
        self._options = options  # the source's: cc.cache(src).options() has them
        self._ids = _Ids()
        self._lock = threading.Lock()
        self._live: dict[int, Iterator[Any]] = {}
        self._taken = threading.local()
        self._control: Callable[[], Iterator[tuple[Any, Any]]] | None = None
        self.decisions: dict[int, Any] = {}  # the generator path's, by token
        self.tokens = _Ids()
        self.source_started: Callable[[], object] = lambda: None  # see unsaved()

    def deciding(self, begin_epoch: Callable[[], Any]) -> Callable[[], Any]:
        """decide() for the control: takes the next (epoch, start), noted for begin()."""
        def decide() -> Any:
            self._taken.value = self._epochs.take()
            return begin_epoch()
        return decide

    def controlled_by(self, control: Callable[[], Iterator[tuple[Any, Any]]]) -> None:
        self._control = control

    def begin(self) -> list[Any]:
        """numpy_function body of the control: [hold, token, mode, epoch, start]."""
        assert self._control is not None
        self._taken.value = (0, 0)
        generator = self._control()
        token, mode = next(generator)  # type: ignore[call-overload]
        epoch, start = self._taken.value
        ident = next(self._ids)
        hold = _hold(ident)
        with self._lock:
            self._live[ident] = generator
        weakref.finalize(hold, self._close, ident)
        return [hold, np.int64(token), np.int64(mode), np.int64(epoch), np.int64(start)]

    def finish(self, hold: np.ndarray) -> np.bool_:
        """numpy_function body after an iteration's batches: commit a write. Drops all."""
        with self._lock:
            generator = self._live.pop(int(hold[0]), None)
        if generator is not None:  # None: a restored iteration's hold names nothing here
            try:
                next(generator, None)
            finally:
                generator.close()  # type: ignore[attr-defined]
        return np.bool_(False)

    def _close(self, ident: int) -> None:
        with self._lock:
            generator = self._live.pop(ident, None)
        if generator is not None:  # cancels an unfinished write
            _quietly(generator.close)  # type: ignore[attr-defined]

    def dataset(self, branch: Callable[..., tf.data.Dataset], empty: tf.data.Dataset,
                per_iteration: Transform = lambda ds: ds) -> tf.data.Dataset:
        """control.flat_map(per_iteration(branch) + finish): branch(token, mode, epoch,
        start) gives an iteration's batches; empty is a dataset of none like them."""
        def iteration(hold: tf.Tensor, token: tf.Tensor, mode: tf.Tensor, epoch: tf.Tensor,
                      start: tf.Tensor) -> tf.data.Dataset:
            finish = tf.data.Dataset.from_tensors(np.int64(0)).filter(
                lambda _: tf.numpy_function(self.finish, [hold], tf.bool, stateful=True)
            ).flat_map(lambda _: per_iteration(empty))
            return per_iteration(branch(token, mode, epoch, start)).concatenate(finish)

        dtypes = [tf.int64] * 5
        control = tf.data.Dataset.from_tensors(np.int64(0)).map(
            lambda _: tuple(tf.numpy_function(self.begin, [], dtypes, stateful=True)))
        return self.reader.options(control.flat_map(iteration).with_options(self._options))


def unsaved(ds: tf.data.Dataset, started: Callable[[], object]) -> tf.data.Dataset:
    """ds, iterated inside a generator's flat_map: an iterator saved while it runs fails.

    For the iterations that run the source pipeline (a write epoch): tf.data
    saves a running from_generator with UnimplementedError ("GeneratorDataset
    does not support checkpointing"), at the save, not at a later restore.
    started() runs in the generator, after from_generator has set glibc's
    thresholds its own way (client/tf/malloc.py): a CacheClient tunes them
    again there, or a JPEG-decoding source costs twice its CPU in page faults.
    """
    def once() -> Iterator[np.int64]:
        started()
        yield np.int64(0)

    guard = tf.data.Dataset.from_generator(once, output_signature=tf.TensorSpec((), tf.int64))
    return guard.flat_map(lambda _: ds)


def generated(iterations: Iterations, decide: Callable[[], Any],
              source: Callable[[Any], Iterator[Any]], signature: Any,
              per_iteration: Transform) -> tf.data.Dataset:
    """cc.cache()'s batches on the generator path (sources that cannot be tapped).

    decide() returns a tap.Decision per iteration; a WRITE or SOURCE iteration
    yields source(decision) through from_generator (which cannot be saved), a
    READ iteration the reader's checkpointable batches.
    """
    decisions, tokens = iterations.decisions, iterations.tokens  # shared by every build

    def control() -> Iterator[tuple[int, int]]:
        decision = decide()
        token = next(tokens)
        decisions[token] = decision
        try:
            yield token, decision.mode
        finally:
            decisions.pop(token, None)

    def run(token: np.int64) -> Iterator[Any]:
        decision = decisions.get(int(token))
        if decision is None:
            raise RuntimeError(f"shardcache: no write was begun for iteration {int(token)}")
        yield from source(decision)

    def branch(token: tf.Tensor, mode: tf.Tensor, epoch: tf.Tensor, start: tf.Tensor
               ) -> tf.data.Dataset:
        read = tf.equal(mode, READ)
        written = tf.data.Dataset.from_generator(run, args=(token,), output_signature=signature)
        reads = iterations.reader.batches(epoch, start)
        return (written.take(tf.where(read, np.int64(0), np.int64(-1)))
                .concatenate(reads.take(tf.where(read, np.int64(-1), np.int64(0)))))

    iterations.controlled_by(control)
    empty = tf.data.Dataset.from_generator(run, args=(np.int64(0),),
                                           output_signature=signature).take(0)
    return iterations.dataset(branch, empty, per_iteration)


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
