"""One training run of ``cacheserver demo``, in a process of its own.

``python -m cacheserver.demo.job JOB_JSON`` trains the demo's model for a few
epochs through ``cc.cache()`` or ``ds.cache()``, prints a line per epoch and
writes its :class:`Run` as JSON for the demo to compare. Memory is the peak of
RssAnon from /proc/<pid>/status, sampled every 10 ms by a background thread:
anonymous RSS leaves out file-backed pages, so LMDB's memory map (and the page
cache behind file reads) does not count.
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from cacheserver.demo.data import (
    BATCH_SIZE,
    DemoError,
    build_model,
    human_size,
    import_tf,
    source_pipeline,
)
from client import CacheClient, CacheNotFoundError, ShardcacheError

# ---------------------------------------------------------------------------- memory


def _rss_anon_kib(pid: int | str = "self") -> int:
    """RssAnon of a process in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class RssSampler:
    """Samples RssAnon of some processes in a background thread and keeps peaks.

    ``reset(key)`` starts a new window; ``peak(key)`` is the highest RssAnon of
    each process (as a tuple, in pids order) since that reset.
    """

    def __init__(self, pids: tuple[int | str, ...] = ("self",), interval_s: float = 0.01) -> None:
        self.pids = pids
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._windows: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        values = [_rss_anon_kib(pid) for pid in self.pids]
        with self._lock:
            for window in self._windows.values():
                for i, value in enumerate(values):
                    window[i] = max(window[i], value)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def reset(self, key: str) -> None:
        with self._lock:
            self._windows[key] = [0] * len(self.pids)
        self._sample()

    def peak(self, key: str) -> tuple[int, ...]:
        """Peak RssAnon (KiB) of each process since reset(key)."""
        self._sample()
        with self._lock:
            return tuple(self._windows[key])


# ---------------------------------------------------------------------------- training


@dataclass
class Epoch:
    seconds: float
    peak_kib: int
    daemon_peak_kib: int
    loss: float
    accuracy: float


@dataclass
class Run:
    label: str
    elements: int
    epochs: list[Epoch] = field(default_factory=list)
    start_kib: int = 0

    @property
    def peak_kib(self) -> int:
        return max(e.peak_kib for e in self.epochs)

    @property
    def daemon_peak_kib(self) -> int:
        return max(e.daemon_peak_kib for e in self.epochs)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Run:
        doc = json.loads(text)
        doc["epochs"] = [Epoch(**e) for e in doc["epochs"]]
        return cls(**doc)


class Notes:
    """What feeds one epoch: asked before it starts (begin) and after it ends (end)."""

    def begin(self, epoch: int) -> None:
        pass

    def end(self, epoch: int) -> str:
        raise NotImplementedError


class MemoryNotes(Notes):
    def end(self, epoch: int) -> str:
        return "source pipeline, filled into memory" if epoch == 0 else "from memory"


class DaemonNotes(Notes):
    """Asks the daemon whether the cache was READY before each epoch, instead of assuming."""

    def __init__(self, cc: Any, name: str) -> None:
        self._cc = cc
        self._name = name
        self._ready_before = False

    def _state(self) -> str:
        try:
            return str(self._cc.info(self._name).state)
        except CacheNotFoundError:
            return "absent"

    def begin(self, epoch: int) -> None:
        self._ready_before = self._state() == "READY"

    def end(self, epoch: int) -> str:
        if self._ready_before:
            return "streamed from the daemon"
        # the commit ends the write behind the last element: give it time on a busy machine
        deadline = time.monotonic() + COMMIT_WAIT_S
        while (state := self._state()) == "WRITING" and time.monotonic() < deadline:
            time.sleep(0.05)
        if state == "READY":
            return "source pipeline, written through to the daemon"
        return "source pipeline; the cache was NOT committed (see the daemon log)"


#: How long an epoch's end waits for a write still committing.
COMMIT_WAIT_S = 60.0


def _warm_up(tf: Any, keras: Any, image_size: int) -> None:
    """One tiny fit, so that TensorFlow's one-time start-up costs land in no epoch."""
    x = tf.zeros([BATCH_SIZE, image_size, image_size, 3])
    y = tf.zeros([BATCH_SIZE], tf.int64)
    build_model(keras, image_size).fit(
        tf.data.Dataset.from_tensors((x, y)), epochs=1, shuffle=False, verbose=0
    )


def _train(
    keras: Any,
    run: Run,
    dataset: Any,
    image_size: int,
    num_epochs: int,
    sampler: RssSampler,
    notes: Notes,
    *,
    track_daemon: bool,
) -> None:
    """Fit a fresh model on dataset, printing one line per epoch."""

    class EpochReport(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
            notes.begin(epoch)
            sampler.reset("epoch")
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
            seconds = time.perf_counter() - self._start
            peaks = sampler.peak("epoch")
            logs = logs or {}
            e = Epoch(
                seconds,
                peaks[0],
                peaks[1] if track_daemon else 0,
                float(logs.get("loss", math.nan)),
                float(logs.get("accuracy", math.nan)),
            )
            run.epochs.append(e)
            click.echo(
                f"  {run.label:<8}  epoch {epoch + 1}/{num_epochs}  {e.seconds:6.1f} s  "
                f"{run.elements / e.seconds:8,.0f} elements/s  "
                f"peak RssAnon {human_size(e.peak_kib * 1024):>10}  "
                f"loss {e.loss:.3f}  acc {e.accuracy:.3f}  {notes.end(epoch)}"
            )

    run.start_kib = _rss_anon_kib()
    model = build_model(keras, image_size)
    try:
        model.fit(dataset, epochs=num_epochs, shuffle=False, verbose=0, callbacks=[EpochReport()])
    except BaseException as exc:
        # Ctrl-C, SIGTERM or an error mid-epoch leaves this traceback holding a tf.data
        # iterator whose from_generator() call (cc.cache) may be in flight. Destroyed at
        # interpreter shutdown, when no thread can take the GIL any more, it waits for
        # that call forever and the process never exits; destroyed now, it is fine.
        traceback.clear_frames(exc.__traceback__)
        del model
        gc.collect()
        raise


@dataclass
class TrainJob:
    """One training run, done in a process of its own so that its memory is its own."""

    mode: str  # "cc" or "ds"
    target: str
    name: str
    images: str
    elements: int
    epochs: int
    image_size: int
    daemon_pid: int
    result: str  # where the child writes its Run as JSON

    @property
    def label(self) -> str:
        return f"{self.mode}.cache"


def _train_in_this_process(job: TrainJob) -> Run:
    tf, keras = import_tf()

    _warm_up(tf, keras, job.image_size)
    run = Run(job.label, job.elements)
    source = source_pipeline(tf, Path(job.images), job.elements, job.image_size)
    with CacheClient(job.target) as cc, RssSampler(("self", job.daemon_pid)) as sampler:
        notes: Notes
        if job.mode == "cc":
            ds, notes = cc.cache(source, name=job.name), DaemonNotes(cc, job.name)
        else:
            ds, notes = source.cache(), MemoryNotes()
        _train(
            keras,
            run,
            ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE),
            job.image_size,
            job.epochs,
            sampler,
            notes,
            track_daemon=job.mode == "cc",
        )
    return run


def _child_main(argv: list[str]) -> int:
    """Entry point of a training child: ``python -m cacheserver.demo.job JOB_JSON``."""
    job = TrainJob(**json.loads(argv[0]))
    try:
        run = _train_in_this_process(job)
    except KeyboardInterrupt:  # the parent reports it
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except ShardcacheError as exc:
        click.echo(f"Error: {type(exc).__name__}: {exc}", err=True)
        return 1
    Path(job.result).write_text(run.to_json())
    return 0


def run_child(job: TrainJob) -> Run:
    """Run one TrainJob in a child process (stdout shared) and return its Run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cacheserver.demo.job", json.dumps(asdict(job))],
        stdin=subprocess.DEVNULL,
    )
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the parent is unwinding
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if code != 0:
        raise DemoError(f"the {job.label} training process failed (exit status {code})")
    return Run.from_json(Path(job.result).read_text())


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
