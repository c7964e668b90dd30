"""``cacheserver demo``: train a small Keras model through cc.cache(), then through ds.cache().

What it does, end to end, on one machine:

1. writes a few thousand synthetic PNG images (deterministic, generated once
   and reused) into a TFRecord file under the demo's data directory;
2. starts a real daemon (``cacheserver serve``) on a unix socket in a short
   temporary directory, with its caches in the same data directory;
3. builds an image pipeline (read, decode_png, resize, normalize to float32)
   and trains the same small CNN for a few epochs, first through
   ``cc.cache(ds, name=...)`` and then through ``ds.cache()``, printing each
   epoch's time, elements/s and peak anonymous RSS;
4. prints a comparison table and what the daemon stored, then stops the
   daemon with SIGTERM (also on Ctrl-C, SIGTERM, SIGHUP or an error).

Each training run happens in a fresh child process (``python -m
cacheserver.demo JOB``), so that neither run's memory is inflated by what the
other left in the allocator. Memory is the peak of RssAnon from
/proc/<pid>/status, sampled every 10 ms by a background thread: anonymous RSS
leaves out file-backed pages, so LMDB's memory map (and the page cache behind
file reads) does not count.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

NUM_CLASSES = 10
BATCH_SIZE = 64
#: Source images are this many times larger than the training size, as photos are.
SOURCE_SCALE = 2
#: Bumped whenever the generated images change, so old files are not reused.
IMAGES_VERSION = 1
#: Seconds the demo daemon waits for in-flight streams when stopped.
DAEMON_GRACE_S = 5.0
#: Names of the demo's caches: demo-<elements>x<image size>px.
_DEMO_CACHE = re.compile(r"demo-\d+x\d+px")
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)

INSTALL_HINT = ("pip install 'shardcache[tf-cpu]'  (or 'shardcache[tf]' for a GPU build), "
                "or run `make demo` in a shardcache checkout, which sets up a virtualenv with it")


class DemoError(click.ClickException):
    """A failure the demo explains to the user (exit status 1, no traceback)."""


# ---------------------------------------------------------------------------- paths


def default_data_dir() -> Path:
    """$XDG_CACHE_HOME/shardcache/demo, else ~/.cache/shardcache/demo."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # the spec ignores relative
    return base / "shardcache" / "demo"


def _short_tempdir() -> Path:
    """A fresh private directory whose path leaves room for a unix socket name (108 bytes)."""
    base = tempfile.gettempdir()
    if len(base) > 60 and os.path.isdir("/tmp"):
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="scdemo-", dir=base))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


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


# ---------------------------------------------------------------------------- daemon


class DemoDaemon:
    """``cacheserver serve`` as a child process on a unix socket; stopped with SIGTERM."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir / "daemon.log"
        self.tmp_dir = _short_tempdir()
        self.socket = self.tmp_dir / "cacheserver.sock"
        self.target = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "cacheserver", "serve", "--data-dir", str(self.data_dir),
                "--listen", self.target, "--grace", str(DAEMON_GRACE_S)]

    def __enter__(self) -> DemoDaemon:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, deadline_s: float = 60.0) -> None:
        with open(self.log_path, "wb") as log:
            # A session of its own: Ctrl-C reaches only the demo, which then stops the
            # daemon itself, instead of both racing to shut down.
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy(deadline_s)

    def _wait_healthy(self, deadline_s: float) -> None:
        from cacheserver.probe import NotHealthy, wait_healthy

        proc = self.proc
        assert proc is not None
        try:
            wait_healthy(self.target, deadline_s, still_starting=lambda: proc.poll() is None)
        except NotHealthy as exc:
            status = "" if proc.poll() is None else f" (exit status {proc.returncode})"
            raise DemoError(f"{exc}{status}; its log ({self.log_path}):\n"
                            f"{self.log_tail()}") from exc

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, wait for the drain, SIGKILL if it hangs; remove the socket directory."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(DAEMON_GRACE_S + 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.exit_code = proc.returncode
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into SystemExit, so that cleanup (stopping the daemon) runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        click.echo(f"received {signal.Signals(signum).name}: stopping", err=True)
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---------------------------------------------------------------------------- data


def _import_tf() -> tuple[Any, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        tf = importlib.import_module("tensorflow")  # first: keras 3 would import it anyway
        keras = importlib.import_module("keras")
    except ImportError as exc:
        raise DemoError(f"the demo needs TensorFlow and Keras, which are not installed "
                        f"({exc}).\nInstall them with: {INSTALL_HINT}") from None
    return tf, keras


def _synthetic_image(tf: Any, size: int) -> Callable[[Any], tuple[Any, Any]]:
    """index -> (PNG bytes, label): an oriented grating (orientation = class), a blob, a
    tint and a little noise, all from stateless random ops seeded by the index."""
    ramp = (tf.range(size, dtype=tf.float32) + 0.5) / size
    y, x = ramp[:, None], ramp[None, :]

    def make(i: Any) -> tuple[Any, Any]:
        u = tf.random.stateless_uniform([10], seed=tf.stack([i, IMAGES_VERSION]))
        label = tf.minimum(tf.cast(u[0] * NUM_CLASSES, tf.int64), NUM_CLASSES - 1)
        theta = (tf.cast(label, tf.float32) + 0.3 * (u[1] - 0.5)) * (math.pi / NUM_CLASSES)
        freq = (4.0 + 6.0 * u[2]) * 2.0 * math.pi
        grating = tf.sin((x * tf.cos(theta) + y * tf.sin(theta)) * freq + 2 * math.pi * u[3])
        cy, cx, r = 0.2 + 0.6 * u[4], 0.2 + 0.6 * u[5], 0.1 + 0.2 * u[6]
        blob = tf.exp(-(tf.square(x - cx) + tf.square(y - cy)) / tf.square(r))
        tint = 0.3 + 0.7 * u[7:10]
        noise = tf.random.stateless_normal([size, size, 3], seed=tf.stack([i, -IMAGES_VERSION]))
        image = (0.45 + 0.3 * grating + 0.25 * blob)[:, :, None] * tint + 0.01 * noise
        pixels = tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), tf.uint8)
        return tf.io.encode_png(pixels, compression=1), label

    return make


def ensure_images(tf: Any, directory: Path, elements: int, source_size: int) -> Path:
    """The TFRecord file of the demo's source images; written once, then reused."""
    from tqdm import tqdm

    path = directory / f"synthetic-v{IMAGES_VERSION}-{elements}x{source_size}px.tfrecord"
    if path.exists():
        click.echo(f"source: reusing {elements:,} PNG images ({_size(path.stat().st_size)}) "
                   f"in {path}")
        return path
    directory.mkdir(parents=True, exist_ok=True)
    for pattern in ("synthetic-*.tfrecord", ".synthetic-*.tmp"):  # other sizes, killed runs
        for stale in directory.glob(pattern):
            stale.unlink()
    click.echo(f"source: generating {elements:,} PNG images of {source_size}x{source_size} "
               f"into {path}")
    start = time.monotonic()
    images = (tf.data.Dataset.range(elements)
              .map(_synthetic_image(tf, source_size), num_parallel_calls=tf.data.AUTOTUNE,
                   deterministic=True))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer, \
                tqdm(total=elements, desc="generating images", unit="img", disable=None) as bar:
            for png, label in images.as_numpy_iterator():
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }))
                writer.write(example.SerializeToString())
                bar.update(1)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    click.echo(f"source: {_size(path.stat().st_size)} written in "
               f"{time.monotonic() - start:.1f}s")
    return path


def source_pipeline(tf: Any, path: Path, elements: int, image_size: int) -> Any:
    """The expensive part a cache saves: read, parse, decode_png, resize, normalize."""
    features = {"image": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.int64)}
    mean, std = tf.constant(_MEAN), tf.constant(_STD)

    def preprocess(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        image = tf.io.decode_png(example["image"], channels=3)
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.resize(image, (image_size, image_size), method="bicubic",
                                antialias=True)
        image = (tf.clip_by_value(image, 0.0, 1.0) - mean) / std
        return image, example["label"]

    return (tf.data.TFRecordDataset(str(path))
            .map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .apply(tf.data.experimental.assert_cardinality(elements)))


def build_model(keras: Any, image_size: int) -> Any:
    keras.utils.set_random_seed(0)  # both runs start from the same weights
    model = keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(NUM_CLASSES),
    ])
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


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
        from client import CacheNotFoundError

        try:
            return str(self._cc.info(self._name).state)
        except CacheNotFoundError:
            return "absent"

    def begin(self, epoch: int) -> None:
        self._ready_before = self._state() == "READY"

    def end(self, epoch: int) -> str:
        if self._ready_before:
            return "streamed from the daemon"
        if self._state() == "READY":
            return "source pipeline, written through to the daemon"
        return "source pipeline; the cache was NOT committed (see the daemon log)"


def _warm_up(tf: Any, keras: Any, image_size: int) -> None:
    """One tiny fit, so that TensorFlow's one-time start-up costs land in no epoch."""
    x = tf.zeros([BATCH_SIZE, image_size, image_size, 3])
    y = tf.zeros([BATCH_SIZE], tf.int64)
    build_model(keras, image_size).fit(tf.data.Dataset.from_tensors((x, y)), epochs=1,
                                       shuffle=False, verbose=0)


def _train(keras: Any, run: Run, dataset: Any, image_size: int, num_epochs: int,
           sampler: RssSampler, notes: Notes, *, track_daemon: bool) -> None:
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
            e = Epoch(seconds, peaks[0], peaks[1] if track_daemon else 0,
                      float(logs.get("loss", math.nan)), float(logs.get("accuracy", math.nan)))
            run.epochs.append(e)
            click.echo(f"  {run.label:<8}  epoch {epoch + 1}/{num_epochs}  {e.seconds:6.1f} s  "
                       f"{run.elements / e.seconds:8,.0f} elements/s  "
                       f"peak RssAnon {_size(e.peak_kib * 1024):>10}  "
                       f"loss {e.loss:.3f}  acc {e.accuracy:.3f}  {notes.end(epoch)}")

    run.start_kib = _rss_anon_kib()
    model = build_model(keras, image_size)
    try:
        model.fit(dataset, epochs=num_epochs, shuffle=False, verbose=0,
                  callbacks=[EpochReport()])
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
    tf, keras = _import_tf()
    from client import CacheClient

    _warm_up(tf, keras, job.image_size)
    run = Run(job.label, job.elements)
    source = source_pipeline(tf, Path(job.images), job.elements, job.image_size)
    with CacheClient(job.target) as cc, RssSampler(("self", job.daemon_pid)) as sampler:
        notes: Notes
        if job.mode == "cc":
            ds, notes = cc.cache(source, name=job.name), DaemonNotes(cc, job.name)
        else:
            ds, notes = source.cache(), MemoryNotes()
        _train(keras, run, ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE), job.image_size,
               job.epochs, sampler, notes, track_daemon=job.mode == "cc")
    return run


def _child_main(argv: list[str]) -> int:
    """Entry point of a training child: ``python -m cacheserver.demo JOB_JSON``."""
    from client import ShardcacheError

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


def _run_child(job: TrainJob) -> Run:
    """Run one TrainJob in a child process (stdout shared) and return its Run."""
    proc = subprocess.Popen([sys.executable, "-m", "cacheserver.demo",
                             json.dumps(asdict(job))], stdin=subprocess.DEVNULL)
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


def _print_table(runs: list[Run], dataset_bytes: int) -> None:
    later = "later epochs (cache, mean)" if len(runs[0].epochs) > 2 else "epoch 2 (cache)"
    header = ("", "epoch 1 (source)", later, "RssAnon before", "peak RssAnon", "daemon peak")
    rows = []
    for run in runs:
        first, rest = run.epochs[0], run.epochs[1:]
        mean = sum(e.seconds for e in rest) / len(rest)
        rows.append((run.label,
                     f"{first.seconds:.1f} s {run.elements / first.seconds:>8,.0f}/s",
                     f"{mean:.1f} s {run.elements / mean:>8,.0f}/s",
                     _size(run.start_kib * 1024),
                     _size(run.peak_kib * 1024),
                     _size(run.daemon_peak_kib * 1024) if run.daemon_peak_kib else "-"))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    click.echo("")
    for row in (header, *rows):
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        click.echo("  " + "   ".join(cells))
    click.echo(f"  (each run in a fresh process; the preprocessed dataset is "
               f"{_size(dataset_bytes)}; RssAnon leaves out file-backed pages such as "
               "LMDB's memory map)")
    click.echo("  cc.cache's memory is bounded by prefetch_bytes (256 MiB by default) and the "
               "batches in flight, whatever the dataset size;\n  ds.cache() holds the whole "
               "dataset, so its peak grows with it (docs/benchmarks.md: 1x vs 4x the data)")


def _print_cache(info: Any, data_dir: Path) -> None:
    rows = [
        ("name", info.name), ("state", info.state), ("elements", f"{info.num_elements:,}"),
        ("shards", info.num_shards), ("on disk", _size(info.disk_bytes)),
        ("records", f"{_size(info.raw_bytes)} raw, {_size(info.stored_bytes)} stored"),
        ("compression", f"{info.compression_ratio:.2f}x (zstd)" + (
            "; float32 pixels barely compress, so records are stored raw"
            if info.compression_ratio < 1.05 else "")),
        ("fingerprint", info.fingerprint),
        ("directory", data_dir / "caches" / info.name),
    ]
    click.echo("")
    click.echo("what the daemon stored (as `cacheserver info` shows it):")
    for key, value in rows:
        click.echo(f"  {key:<12} {value}")


# ---------------------------------------------------------------------------- main


def run_demo(*, data_dir: Path | None = None, elements: int = 3000, epochs: int = 3,
             image_size: int = 96) -> None:
    """Run the whole demo; see the module docstring. Raises DemoError on failure."""
    if elements < 1 or epochs < 2 or image_size < 1:
        raise DemoError("the demo needs elements >= 1, epochs >= 2 and image_size >= 1")
    began = time.monotonic()
    data_dir = (data_dir or default_data_dir()).expanduser().absolute()
    tf, _ = _import_tf()
    from client import CacheClient, ShardcacheError

    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot create the data directory {data_dir}: {exc}") from exc
    click.echo(f"shardcache demo: {elements:,} images -> {image_size}x{image_size} float32, "
               f"{epochs} epochs, batch {BATCH_SIZE}, TensorFlow {tf.__version__}")
    click.echo(f"data directory: {data_dir}")
    images = ensure_images(tf, data_dir / "images", elements, image_size * SOURCE_SCALE)
    name = f"demo-{elements}x{image_size}px"

    with _signals_unwind(), DemoDaemon(data_dir) as daemon, CacheClient(daemon.target) as cc:
        assert daemon.proc is not None
        click.echo(f"daemon: pid {daemon.proc.pid} serving {daemon.target} "
                   f"(log: {daemon.log_path})")
        try:
            for earlier in cc.list():  # so that epoch 1 writes, and old sizes free their disk
                if _DEMO_CACHE.fullmatch(earlier.name) and earlier.state == "READY":
                    cc.delete(earlier.name)
                    click.echo(f"deleted the cache {earlier.name!r} of an earlier run")
            runs = []
            for mode, how in (("cc", f"cc.cache(ds, name={name!r})"), ("ds", "ds.cache()")):
                click.echo("")
                click.echo(f"training through {how} -> .batch({BATCH_SIZE})"
                           ".prefetch(AUTOTUNE), in a fresh process:")
                job = TrainJob(mode, daemon.target, name, str(images), elements, epochs,
                               image_size, daemon.proc.pid,
                               str(daemon.tmp_dir / f"result-{mode}.json"))
                runs.append(_run_child(job))
            info = cc.info(name)
            _print_table(runs, info.raw_bytes)
            _print_cache(info, data_dir)
        except ShardcacheError as exc:
            raise DemoError(f"{type(exc).__name__}: {exc}\ndaemon log ({daemon.log_path}):\n"
                            f"{daemon.log_tail()}") from exc
    click.echo("")
    click.echo(f"daemon stopped (exit status {daemon.exit_code}); total "
               f"{time.monotonic() - began:.0f}s. The cache stays in {data_dir}: "
               f"`cacheserver serve --data-dir {data_dir}` serves it again.")


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
