"""Draws docs/img/cacheserver_top.png and tensorboard_input_stall.png (make screenshots).

The pictures of the input stall in docs/, taken from a real daemon and real Keras training:
TensorBoard's ``input_stall`` scalars and a frame of ``cacheserver top``.

    make screenshots                                   # rewrites the two PNGs in docs/img/
    .venv/bin/python bench/screenshots.py --out /tmp/shots

One daemon (``--metrics-listen``), one cache of ``--elements`` 150 KB images, and two
training processes, each ``model.fit`` of a tiny model over ``cc.timed(cc.dataset(...)...)``
with ``client.InputStallCallback(LOGDIR/JOB, every_n_batches=...)`` and
``CacheClient(job=JOB)``. As root, the daemon runs in a network namespace joined to this one
by a veth link capped at ``--mbit`` (tests/fleet.py's NetnsLink): ``starved`` reads over
the data plane across that link, a chunk at a time (``parallel_shards=1``), and its step
costs nothing, so it waits on its input; ``ahead`` reads over gRPC (the unix socket, not
capped) and spends ``--step-ms`` per batch (a sleep standing for the accelerator's step),
so its input keeps ahead. Without root, the daemon listens on loopback, ``starved`` reads
over gRPC and ``ahead`` over the data plane. While both read,
``cacheserver top --once`` (the real command, its colours kept) is drawn as
``cacheserver_top.png``. When both have trained at least ``--min-epochs``, TensorBoard is
started on LOGDIR on 127.0.0.1 and headless Chromium photographs its scalars page,
``tensorboard_input_stall.png``.

Needs TensorBoard (the ``screenshots`` extra, which ``make screenshots`` installs) and Chromium
(``apt-get install -y chromium``, or ``--chromium PATH``).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from harness import REPO_ROOT, BenchDaemon, arguments, child_env, free_port, linked_daemon
from workloads import WORKLOADS, make_source

from cacheserver.cli.top import scrape
from tests.fleet import NetnsLink, can_make_netns

CACHE, WORKLOAD = "images", "flat-150k"
JOBS = ("starved", "ahead")
BATCH = 32
TOP_WIDTH = 112  # columns of the terminal top is drawn in
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def tools(chromium: str | None) -> str:
    """Chromium's path, once TensorBoard and Chromium are both found; else exit saying
    which is missing and how to install it."""
    missing = []
    if importlib.util.find_spec("tensorboard") is None:
        missing.append(
            f"TensorBoard (not importable by {sys.executable}): "
            f"{sys.executable} -m pip install -e '.[screenshots]' (from the "
            "repository root)"
        )
    found = [
        shutil.which(name)
        for name in ([chromium] if chromium else ["chromium", "chromium-browser", "google-chrome"])
    ]
    browser = next(filter(None, found), None)
    if browser is None:
        missing.append(
            f"Chromium ({chromium or 'chromium'} not found): apt-get install -y "
            "chromium, or pass --chromium PATH"
        )
    if missing:
        raise SystemExit("bench/screenshots.py needs " + "; and ".join(missing))
    assert browser is not None
    return browser


def train(args: argparse.Namespace) -> None:
    """One training process (``--train JOB``): model.fit until ``--stop`` exists and at least
    ``--min-epochs`` are done."""
    import keras
    import tensorflow as tf

    import client

    starved = args.train == "starved"
    step_s = 0.0 if starved else args.step_ms / 1000
    stop = Path(args.stop)
    with client.CacheClient(args.target, job=args.train) as cc:
        ds = cc.dataset(CACHE, direct=False, parallel_shards=1 if starved else 0)
        ds = cc.timed(ds.batch(BATCH).prefetch(tf.data.AUTOTUNE))
        model = keras.Sequential(
            [
                keras.Input(WORKLOADS[WORKLOAD].feature_shape),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(WORKLOADS[WORKLOAD].label_modulus),
            ]
        )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

        def epoch_end(epoch: int, logs: object) -> None:
            model.stop_training = epoch + 1 >= args.min_epochs and stop.exists()

        def step(batch: int, logs: object) -> None:  # the accelerator's step
            time.sleep(step_s)

        model.fit(
            ds,
            epochs=10_000,
            verbose=0,
            shuffle=False,
            callbacks=[
                client.InputStallCallback(Path(args.log_dir) / args.train, every_n_batches=16),
                keras.callbacks.LambdaCallback(on_train_batch_end=step, on_epoch_end=epoch_end),
            ],
        )


def wait_for(
    what: str,
    ready: Callable[[], bool],
    deadline_s: float,
    processes: dict[str, subprocess.Popen[bytes]],
) -> None:
    """Poll ``ready()`` every 0.5 s until it is true; RuntimeError past the deadline or when
    one of ``processes`` (by name) has exited."""
    end = time.monotonic() + deadline_s
    while not ready():
        dead = [name for name, proc in processes.items() if proc.poll() is not None]
        if dead or time.monotonic() > end:
            raise RuntimeError(
                f"no {what} after {deadline_s:g} s"
                if not dead
                else f"{dead[0]} exited while waiting for {what}"
            )
        time.sleep(0.5)


def reading_jobs(metrics_url: str) -> set[str]:
    """The training jobs the daemon's /metrics shows readers of."""
    return {
        dict(labels).get("training_job", "")
        for (name, labels) in scrape(metrics_url)
        if name == "shardcache_reader_elements_total"
    }


def svg_size(svg: str) -> tuple[int, int]:
    """The width and height of an SVG's viewBox, rounded up to whole pixels."""
    match = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) ([\d.]+)"', svg)
    if match is None:
        raise ValueError("the SVG has no viewBox")
    return int(float(match[1]) + 0.999), int(float(match[2]) + 0.999)


def terminal_svg(ansi: str, title: str) -> str:
    """A terminal's output (ANSI colours) drawn as rich's SVG of a terminal window."""
    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=TOP_WIDTH, file=io.StringIO())
    console.print(Text.from_ansi(ansi.rstrip("\n")))
    return console.export_svg(title=title)


def photograph(
    browser: str, url: str, png: Path, size: tuple[int, int], scratch: Path, wait_ms: int = 0
) -> None:
    """Headless Chromium's screenshot of ``url``, ``size`` CSS pixels, into ``png``."""
    profile = Path(tempfile.mkdtemp(prefix="profile-", dir=scratch))
    cmd = [
        browser,
        *BROWSER_FLAGS,
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        f"--window-size={size[0]},{size[1]}",
        "--force-device-scale-factor=1",
    ]
    if wait_ms:
        cmd.append(f"--virtual-time-budget={wait_ms}")
    png.unlink(missing_ok=True)
    done = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.exists():
        raise RuntimeError(
            f"Chromium wrote no screenshot of {url} (exit code "
            f"{done.returncode}): {done.stderr[-800:]}"
        )


def capture_top(browser: str, daemon: BenchDaemon, metrics: str, png: Path, scratch: Path) -> None:
    """``cacheserver top --once`` on the daemon, its colours kept, drawn into ``png``; its
    rates over 10 s, two of each reader's reports (every 5 s)."""
    top = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheserver",
            "top",
            "--once",
            "--interval",
            "10",
            "--metrics",
            metrics,
            "--target",
            daemon.target,
        ],
        env={
            **child_env(),
            "COLUMNS": str(TOP_WIDTH),
            "FORCE_COLOR": "1",
            "TERM": "xterm-256color",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    if top.returncode != 0:
        raise RuntimeError(f"cacheserver top failed: {top.stderr[-800:]}")
    svg = terminal_svg(top.stdout, "cacheserver top")
    (scratch / "top.svg").write_text(svg)
    photograph(browser, (scratch / "top.svg").as_uri(), png, svg_size(svg), scratch)


def capture_tensorboard(browser: str, log_dir: Path, png: Path, scratch: Path) -> None:
    """TensorBoard on ``log_dir`` (127.0.0.1, a free port), its input_stall scalars drawn
    into ``png``."""
    port = free_port()
    with open(scratch / "tensorboard.log", "wb") as log:
        board = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(log_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=log,
        )
    tags = f"http://127.0.0.1:{port}/data/plugin/scalars/tags"

    def runs_loaded() -> bool:
        try:
            with urllib.request.urlopen(tags, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return False
        return all(f'"{job}/train"' in text for job in JOBS) and "input_stall" in text

    try:
        wait_for("TensorBoard serving both runs", runs_loaded, 120, {"tensorboard": board})
        photograph(
            browser,
            f"http://127.0.0.1:{port}/?darkMode=false#scalars"
            "&_smoothingWeight=0&tagFilter=input_stall",
            png,
            (1100, 470),
            scratch,
            wait_ms=20_000,
        )
    finally:
        board.terminate()
        board.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "docs" / "img",
        help="where the two PNGs go (default docs/img)",
    )
    parser.add_argument("--elements", type=int, default=2048)
    parser.add_argument(
        "--step-ms", type=float, default=50.0, help="the ahead job's step per batch (default 50)"
    )
    parser.add_argument("--min-epochs", type=int, default=6)
    parser.add_argument(
        "--mbit",
        type=float,
        default=400,
        help="the starved job's link, as root (default 400 Mbit/s)",
    )
    parser.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the scratch directory (TensorBoard logs, each process's log)",
    )
    for hidden in ("--train", "--target", "--log-dir", "--stop"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train:
        train(args)
        return 0
    browser = tools(args.chromium)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="shots-"))
    log_dir, stop = scratch / "logs", scratch / "stop"
    link = NetnsLink(1) if can_make_netns() else None
    daemon, listen = linked_daemon(scratch, "shots", link)
    metrics = f"http://{listen}/metrics"
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        daemon.start()
        from client import CacheClient

        with CacheClient(daemon.target) as cc:
            for _ in cc.cache(make_source(WORKLOADS[WORKLOAD], args.elements), CACHE):
                pass
        print(f"cache {CACHE!r} written; training {', '.join(JOBS)}", file=sys.stderr)
        if link is not None:
            link.rate(args.mbit)
        for job in JOBS:
            over_link = (job == "starved") == (link is not None)
            target = str(daemon.tcp_target) if over_link else daemon.target
            with open(scratch / f"{job}.log", "wb") as log:
                children[job] = subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--train",
                        job,
                        "--target",
                        target,
                        "--log-dir",
                        str(log_dir),
                        "--stop",
                        str(stop),
                        "--step-ms",
                        str(args.step_ms),
                        "--min-epochs",
                        str(args.min_epochs),
                    ],
                    env=child_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        wait_for("reports of both jobs", lambda: reading_jobs(metrics) >= set(JOBS), 300, children)
        capture_top(browser, daemon, metrics, args.out / "cacheserver_top.png", scratch)
        stop.touch()  # each job ends at the end of an epoch, once it has trained min_epochs
        for job, child in children.items():
            if child.wait(timeout=600) != 0:
                raise RuntimeError(f"the {job} job failed: see {scratch}/{job}.log")
        capture_tensorboard(browser, log_dir, args.out / "tensorboard_input_stall.png", scratch)
    except BaseException:
        print(f"kept for a look: {scratch}", file=sys.stderr)
        raise
    finally:
        stop.touch()
        for child in children.values():
            if child.poll() is None:
                child.terminate()
                child.wait(timeout=30)
        daemon.stop()
        if link is not None:
            link.close()
    print(
        f"written: {args.out}/cacheserver_top.png, {args.out}/tensorboard_input_stall.png",
        file=sys.stderr,
    )
    if args.keep:
        print(f"kept: {scratch}", file=sys.stderr)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
