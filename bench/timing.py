"""Timing: an epoch to its last batch, arms read in turn, bytes moved with the CPU they cost;
the markdown tables and ratios the entry points print."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from harness import GB
from probes import cpu_seconds

if TYPE_CHECKING:
    import tensorflow as tf

T = TypeVar("T")


# ---------------------------------------------------------------------- timing
@dataclass
class EpochResult:
    """Outcome of one timed epoch."""

    seconds: float
    elements: int
    label_sum: int | None  # None when the epoch yields no labels (Dataset.save, bare tensors)


def timed_iteration(ds: tf.data.Dataset) -> EpochResult:
    """Iterate a batched ``ds`` once, timed from creating the iterator to its last batch.

    The clock stops *before* the iterator is destroyed: tearing one down (autotune, prefetch
    threads) can stall for seconds. ``(features, labels)`` batches are checked by the sum of
    their labels; other batches are counted by their first tensor's rows.
    """
    start = time.perf_counter()
    iterator = iter(ds)
    elements = 0
    label_sum: int | None = None
    for batch in iterator:
        if isinstance(batch, tuple) and len(batch) == 2:
            labels = batch[1]
            elements += int(labels.shape[0])
            label_sum = (label_sum or 0) + int(labels.numpy().sum())
        else:
            elements += int(_first_tensor(batch).shape[0])
    seconds = time.perf_counter() - start
    del iterator
    return EpochResult(seconds=seconds, elements=elements, label_sum=label_sum)


def graph_iteration(ds: tf.data.Dataset) -> EpochResult:
    """Iterate a batched ``ds`` once inside a ``tf.function``, as ``model.fit`` takes its
    batches: no Python between them. Timed as :func:`timed_iteration`, from creating the
    iterator to its last batch (the iterator is destroyed after the clock stops); elements
    are counted by their first tensor's rows, labels not summed."""
    global _drain
    if _drain is None:
        import tensorflow as tf

        @tf.function  # traced once per element_spec: the iterator is its argument
        def drain(iterator: Any) -> tf.Tensor:
            n = tf.constant(0, tf.int64)
            for batch in iterator:
                n += tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
            return n

        _drain = drain
    start = time.perf_counter()
    iterator = iter(ds)
    elements = int(_drain(iterator))
    seconds = time.perf_counter() - start
    del iterator
    return EpochResult(seconds=seconds, elements=elements, label_sum=None)


_drain: Any = None  # graph_iteration's loop, made on first use (TensorFlow loads lazily)


def _first_tensor(batch: Any) -> Any:
    while isinstance(batch, (tuple, list, dict)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return batch


#: What :func:`timed` gives: seconds, bytes moved, CPU seconds of this process and of the server.
Row = tuple[float, int, float, float]
ROW_KEYS = ("seconds", "bytes", "cpu", "server_cpu")


def timed(fn: Callable[[], int], server_pid: int = 0) -> Row:
    """Run fn (returning bytes moved): its seconds, bytes and CPU seconds (self, server)."""
    before, server_before = cpu_seconds(), cpu_seconds(server_pid) if server_pid else 0.0
    start = time.perf_counter()
    moved = fn()
    seconds = time.perf_counter() - start
    server = cpu_seconds(server_pid) - server_before if server_pid else 0.0
    return seconds, moved, cpu_seconds() - before, server


def per_gb(cpu: float, moved: int) -> str:
    """CPU seconds per GB moved, ``-`` for none measured."""
    return f"{cpu / (moved / GB):.2f}" if cpu else "-"


# ---------------------------------------------------------------------- tables
def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(
    value: float | None, base: float | None = 1.0, bold: bool = False, missing: str = "-"
) -> str:
    """``value / base`` as ``1.23x`` (bold: ``**1.23x**``), or ``missing`` without both."""
    if value is None or not base:
        return missing
    text = f"{value / base:.2f}x"
    return f"**{text}**" if bold else text


#: An arm reads one epoch: (elements/s, CPU seconds of the reading process).
Arm = Callable[[], tuple[float, float]]


def local_arm(ds: Any, n: int, in_graph: bool = False) -> Arm:
    """An arm that reads ``ds`` (batches) in this process, checking it yields n elements;
    in_graph: inside a ``tf.function`` (:func:`graph_iteration`), else a Python loop."""

    def read() -> tuple[float, float]:
        before = cpu_seconds()
        result = graph_iteration(ds) if in_graph else timed_iteration(ds)
        if result.elements != n:
            raise RuntimeError(f"an epoch yielded {result.elements} elements, not {n}")
        return n / result.seconds, cpu_seconds() - before

    return read


def interleaved(arms: dict[str, Callable[[], T]], repeat: int) -> dict[str, list[T]]:
    """Each arm once to warm up, then repeat passes of every arm in turn (A, B, ..., A, B,
    ...), so that every one meets the same noise: each arm's results, in order."""
    for arm in arms.values():
        arm()
    results: dict[str, list[T]] = {name: [] for name in arms}
    for i in range(repeat):
        for name, arm in arms.items():
            results[name].append(arm())
        print(f"pass {i + 1}/{repeat} done", file=sys.stderr)
    return results
