"""cc.cache()'s iterations: each decides to read, write through or pass the source through."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from client.read.planning.shares import Batches
from client.tf.reads import Holds, Reader, Transform
from client.tf.tap import READ


class Iterations:
    """The Python side of cc.cache()'s control: what each iteration does, by hold.

    control() is tap.TapEpochs.control (or the generator path's twin): a
    generator that decides, yields (token, mode) once, and commits a write when
    asked again; closing it early cancels the write. begin() runs it up to its
    yield, finish() asks again (after the iteration's batches), and the hold's
    finalizer closes it however the iteration ends. A restored iteration's hold
    is not live: it finishes nothing, and a tap of its source passes the
    batches through (convert.tapped_batches): the write it belonged to is gone
    with its process or iterator, and the source runs on uncached.
    """

    def __init__(self, reader: Reader, epochs: Any, options: tf.data.Options) -> None:
        self.reader = reader
        self._epochs = epochs
        self._options = options  # the source's: cc.cache(src).options() has them
        self._holds = Holds(lambda generator: generator.close())
        self._taken = threading.local()
        self._control: Callable[[], Iterator[tuple[Any, Any]]] | None = None
        self.decisions: dict[int, Any] = {}  # the generator path's, by token
        self.tokens = itertools.count(1)
        self.source_started: Callable[[], object] = lambda: None  # see started()

    def deciding(self, begin_epoch: Callable[[], Any]) -> Callable[[], Any]:
        """decide() for the control: takes the next (epoch, start), noted for begin()."""

        def decide() -> Any:
            self._taken.value = self._epochs.take()
            return begin_epoch()

        return decide

    def controlled_by(self, control: Callable[[], Iterator[tuple[Any, Any]]]) -> None:
        self._control = control

    def begin(self, _: np.int64) -> list[Any]:
        """numpy_function body of the control: [hold, token, mode, epoch, start]."""
        assert self._control is not None
        self._taken.value = (0, 0)
        generator = self._control()
        token, mode = next(generator)  # type: ignore[call-overload]
        epoch, start = self._taken.value
        hold = self._holds.new(generator)
        return [hold, np.int64(token), np.int64(mode), np.int64(epoch), np.int64(start)]

    def live(self, hold: np.ndarray) -> bool:
        """Whether hold is a live iteration's here (not a restored one)."""
        return self._holds.live(hold) is not None

    def finish(self, hold: np.ndarray) -> np.bool_:
        """numpy_function body after an iteration's batches: commit a write. Drops all."""
        generator = self._holds.pop(hold)
        if generator is not None:  # None: a restored iteration's hold names nothing here
            try:
                next(generator, None)
            finally:
                generator.close()
        return np.bool_(False)

    def started(self, epoch: np.int64) -> np.int64:
        """numpy_function body run when an iteration is built, or rebuilt by a restore: a
        restored iteration moves the epoch counter past its epoch, as reads do
        (client/tf/reads.py). source_started() runs here too: a CacheClient tunes
        glibc's thresholds (client/tf/malloc.py) before a source runs."""
        self.source_started()
        self._epochs.seen(int(epoch))
        return np.int64(0)

    def dataset(
        self, branch: Callable[..., tf.data.Dataset], per_iteration: Transform = lambda ds: ds
    ) -> tf.data.Dataset:
        """control.flat_map(per_iteration(branch) + finish): branch(hold, token, mode,
        epoch, start) gives an iteration's batches."""

        @tf.autograph.experimental.do_not_convert  # and what it traces: plain TF ops
        def iteration(
            hold: tf.Tensor, token: tf.Tensor, mode: tf.Tensor, epoch: tf.Tensor, start: tf.Tensor
        ) -> tf.data.Dataset:
            batches = per_iteration(branch(hold, token, mode, epoch, start))
            started = tf.numpy_function(self.started, [epoch], tf.int64, stateful=False)
            finish = (
                tf.data.Dataset.from_tensors(started)
                .filter(lambda _: tf.numpy_function(self.finish, [hold], tf.bool, stateful=False))
                .flat_map(lambda _: batches.take(0))
            )  # none, like batches: take(0) never starts it
            return batches.concatenate(finish)

        @tf.autograph.experimental.do_not_convert
        def begin(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
            return tuple(tf.numpy_function(self.begin, [x], [tf.int64] * 5, stateful=False))

        control = tf.data.Dataset.from_tensors(np.int64(0)).map(begin)
        return control.flat_map(iteration).with_options(self._options)


def generated(
    iterations: Iterations,
    decide: Callable[[], Any],
    source: Callable[[Any], Iterator[Any]],
    signature: Any,
    per_iteration: Transform = lambda ds: ds,
    batches: Batches | None = None,
) -> tf.data.Dataset:
    """cc.cache()'s batches on the generator path (sources that cannot be tapped).

    decide() returns a tap.Decision per iteration; a WRITE or SOURCE iteration
    yields source(decision) through from_generator (which cannot be saved), a
    READ iteration the reader's checkpointable batches; batches: a batch()'s, the
    source's rebatched and the reader's read as batches. from_generator's PyFunc
    is stateful and sits in every iteration's graph, so these datasets set the
    external state policy IGNORE: a save then fails only inside a from_generator
    run ("GeneratorDataset does not support checkpointing") and read iterations save.
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

    def branch(
        hold: tf.Tensor, token: tf.Tensor, mode: tf.Tensor, epoch: tf.Tensor, start: tf.Tensor
    ) -> tf.data.Dataset:
        read = tf.equal(mode, READ)
        written = tf.data.Dataset.from_generator(run, args=(token,), output_signature=signature)
        if batches is not None:
            written = written.rebatch(batches.size, drop_remainder=batches.drop_remainder)
        reads = iterations.reader.batches(epoch, start, batches=batches, wanted=read)
        return written.take(tf.where(read, np.int64(0), np.int64(-1))).concatenate(
            reads.take(tf.where(read, np.int64(-1), np.int64(0)))
        )

    iterations.controlled_by(control)
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return iterations.dataset(branch, per_iteration).with_options(options)
