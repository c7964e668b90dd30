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
cacheserver.demo.job JOB``, cacheserver/demo/job.py), so that neither run's
memory is inflated by what the other left in the allocator; its images and
model are cacheserver/demo/data.py's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from cacheserver.demo.data import BATCH_SIZE, DemoError, ensure_images, human_size, import_tf
from cacheserver.demo.job import Run, TrainJob, run_child
from cacheserver.launch import DaemonProcess, DaemonStartError
from client import CacheClient, ShardcacheError

#: Source images are this many times larger than the training size, as photos are.
SOURCE_SCALE = 2
#: Seconds the demo daemon waits for in-flight streams when stopped.
DAEMON_GRACE_S = 5.0
#: Names of the demo's caches: demo-<elements>x<image size>px.
_DEMO_CACHE = re.compile(r"demo-\d+x\d+px")


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


# ---------------------------------------------------------------------------- daemon


class DemoDaemon(DaemonProcess):
    """The demo's daemon: a unix socket in a private temp dir, its log beside the data.

    It runs in a session of its own: Ctrl-C reaches only the demo, which then
    stops the daemon itself, instead of both racing to shut down.
    """

    def __init__(self, data_dir: Path) -> None:
        self.tmp_dir = _short_tempdir()
        super().__init__(
            data_dir,
            [f"unix://{self.tmp_dir / 'cacheserver.sock'}"],
            data_dir / "daemon.log",
            ("--grace", str(DAEMON_GRACE_S)),
            new_session=True,
        )
        self.exit_code: int | None = None

    def __enter__(self) -> DemoDaemon:
        self.log_path.unlink(missing_ok=True)  # this run's log only
        try:
            self.start()
        except DaemonStartError as exc:
            self.__exit__()
            raise DemoError(str(exc)) from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """SIGTERM, wait for the drain, SIGKILL if it hangs; remove the socket directory."""
        self.exit_code = self.stop(DAEMON_GRACE_S + 30)
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


def _print_table(runs: list[Run], dataset_bytes: int) -> None:
    later = "later epochs (cache, mean)" if len(runs[0].epochs) > 2 else "epoch 2 (cache)"
    header = ("", "epoch 1 (source)", later, "RssAnon before", "peak RssAnon", "daemon peak")
    rows = []
    for run in runs:
        first, rest = run.epochs[0], run.epochs[1:]
        mean = sum(e.seconds for e in rest) / len(rest)
        rows.append(
            (
                run.label,
                f"{first.seconds:.1f} s {run.elements / first.seconds:>8,.0f}/s",
                f"{mean:.1f} s {run.elements / mean:>8,.0f}/s",
                human_size(run.start_kib * 1024),
                human_size(run.peak_kib * 1024),
                human_size(run.daemon_peak_kib * 1024) if run.daemon_peak_kib else "-",
            )
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    click.echo("")
    for row in (header, *rows):
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        click.echo("  " + "   ".join(cells))
    click.echo(
        f"  (each run in a fresh process; the preprocessed dataset is "
        f"{human_size(dataset_bytes)}; RssAnon leaves out file-backed pages such as "
        "LMDB's memory map)"
    )
    click.echo(
        "  cc.cache's memory is bounded by prefetch_bytes (256 MiB by default) and the "
        "batches in flight, whatever the dataset size;\n  ds.cache() holds the whole "
        "dataset, so its peak grows with it (docs/benchmarks.md: 1x vs 4x the data)"
    )


def _print_cache(info: Any, data_dir: Path) -> None:
    rows = [
        ("name", info.name),
        ("state", info.state),
        ("elements", f"{info.num_elements:,}"),
        ("shards", info.num_shards),
        ("on disk", human_size(info.disk_bytes)),
        ("records", f"{human_size(info.raw_bytes)} raw, {human_size(info.stored_bytes)} stored"),
        (
            "compression",
            f"{info.compression_ratio:.2f}x (zstd)"
            + (
                "; float32 pixels barely compress, so records are stored raw"
                if info.compression_ratio < 1.05
                else ""
            ),
        ),
        ("fingerprint", info.fingerprint),
        ("directory", data_dir / "caches" / info.name),
    ]
    click.echo("")
    click.echo("what the daemon stored (as `cacheserver info` shows it):")
    for key, value in rows:
        click.echo(f"  {key:<12} {value}")


# ---------------------------------------------------------------------------- main


def run_demo(
    *, data_dir: Path | None = None, elements: int = 3000, epochs: int = 3, image_size: int = 96
) -> None:
    """Run the whole demo; see the module docstring. Raises DemoError on failure."""
    if elements < 1 or epochs < 2 or image_size < 1:
        raise DemoError("the demo needs elements >= 1, epochs >= 2 and image_size >= 1")
    began = time.monotonic()
    data_dir = (data_dir or default_data_dir()).expanduser().absolute()
    tf, _ = import_tf()

    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot create the data directory {data_dir}: {exc}") from exc
    click.echo(
        f"shardcache demo: {elements:,} images -> {image_size}x{image_size} float32, "
        f"{epochs} epochs, batch {BATCH_SIZE}, TensorFlow {tf.__version__}"
    )
    click.echo(f"data directory: {data_dir}")
    images = ensure_images(tf, data_dir / "images", elements, image_size * SOURCE_SCALE)
    name = f"demo-{elements}x{image_size}px"

    with _signals_unwind(), DemoDaemon(data_dir) as daemon, CacheClient(daemon.target) as cc:
        assert daemon.proc is not None
        click.echo(
            f"daemon: pid {daemon.proc.pid} serving {daemon.target} (log: {daemon.log_path})"
        )
        try:
            for earlier in cc.list():  # so that epoch 1 writes, and old sizes free their disk
                if _DEMO_CACHE.fullmatch(earlier.name) and earlier.state == "READY":
                    cc.delete(earlier.name)
                    click.echo(f"deleted the cache {earlier.name!r} of an earlier run")
            runs = []
            for mode, how in (("cc", f"cc.cache(ds, name={name!r})"), ("ds", "ds.cache()")):
                click.echo("")
                click.echo(
                    f"training through {how} -> .batch({BATCH_SIZE})"
                    ".prefetch(AUTOTUNE), in a fresh process:"
                )
                job = TrainJob(
                    mode,
                    daemon.target,
                    name,
                    str(images),
                    elements,
                    epochs,
                    image_size,
                    daemon.proc.pid,
                    str(daemon.tmp_dir / f"result-{mode}.json"),
                )
                runs.append(run_child(job))
            info = cc.info(name)
            _print_table(runs, info.raw_bytes)
            _print_cache(info, data_dir)
        except ShardcacheError as exc:
            raise DemoError(
                f"{type(exc).__name__}: {exc}\ndaemon log ({daemon.log_path}):\n{daemon.log_tail()}"
            ) from exc
    click.echo("")
    click.echo(
        f"daemon stopped (exit status {daemon.exit_code}); total "
        f"{time.monotonic() - began:.0f}s. The cache stays in {data_dir}: "
        f"`cacheserver serve --data-dir {data_dir}` serves it again."
    )
