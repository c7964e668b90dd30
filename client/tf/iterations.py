"""cc.cache()'s iterations: each decides to read, write through or pass the source through."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from client.tf.reads import Ids, Reader, Transform, new_hold, quietly
from client.tf.tap import READ


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
        self._ids = Ids()
        self._lock = threading.Lock()
        self._live: dict[int, Iterator[Any]] = {}
        self._taken = threading.local()
        self._control: Callable[[], Iterator[tuple[Any, Any]]] | None = None
        self.decisions: dict[int, Any] = {}  # the generator path's, by token
        self.tokens = Ids()
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
        hold = new_hold(ident)
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
            quietly(generator.close)  # type: ignore[attr-defined]

    def dataset(self, branch: Callable[..., tf.data.Dataset],
                per_iteration: Transform = lambda ds: ds) -> tf.data.Dataset:
        """control.flat_map(per_iteration(branch) + finish): branch(token, mode, epoch,
        start) gives an iteration's batches."""
        @tf.autograph.experimental.do_not_convert  # and what it traces: plain TF ops
        def iteration(hold: tf.Tensor, token: tf.Tensor, mode: tf.Tensor, epoch: tf.Tensor,
                      start: tf.Tensor) -> tf.data.Dataset:
            batches = per_iteration(branch(token, mode, epoch, start))
            finish = tf.data.Dataset.from_tensors(np.int64(0)).filter(
                lambda _: tf.numpy_function(self.finish, [hold], tf.bool, stateful=True)
            ).flat_map(lambda _: batches.take(0))  # none, like batches: take(0) never starts it
            return batches.concatenate(finish)

        @tf.autograph.experimental.do_not_convert
        def begin(_: tf.Tensor) -> tuple[tf.Tensor, ...]:
            return tuple(tf.numpy_function(self.begin, [], [tf.int64] * 5, stateful=True))

        control = tf.data.Dataset.from_tensors(np.int64(0)).map(begin)
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
    return iterations.dataset(branch, per_iteration)
