"""Benchmark shardcache against tf.data's own caching options.

Run from the repository root::

    .venv/bin/python bench/run.py [--quick] [--sizes image=1000,4000 small=200000,800000]
                                  [--strategies ...] [--out results.json]

For every workload, size and strategy a fresh measurement process (``measure.py``) runs two
epochs and reports times and peak anonymous RSS. For the ``shardcache`` strategy this process
starts one ``cacheserver`` daemon per workload on a unix socket and stops it afterwards.

stdout receives markdown ready for ``docs/benchmarks.md`` (header with the reproducing command
and machine facts, results table, notes); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from measure import RESULT_PREFIX, WARMUP_BATCHES, RssSampler, directory_bytes, kib_to_mb
from report import GB, add_derived, add_ratios, render_notes, render_table, representative
from slow_disk import SlowDisk, SlowDiskError
from strategies import EXTRA_STRATEGIES, STRATEGIES
from workloads import DEFAULT_WORKLOADS, WORKLOADS

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
MEASURE_SCRIPT = BENCH_DIR / "measure.py"


class DaemonError(Exception):
    """The cacheserver daemon could not be started."""


class Daemon:
    """A ``cacheserver serve`` subprocess listening on a unix socket.

    Started with ``python -m cacheserver serve --data-dir DIR --listen unix://SOCK`` from the
    repository root; ready once the socket file exists and a gRPC channel to it connects.
    """

    def __init__(self, data_dir: Path, socket_path: Path, log_path: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        """Describe a daemon (``extra_args``: more ``serve`` flags); nothing starts yet."""
        self.data_dir = data_dir
        self.socket_path = socket_path
        self.log_path = log_path
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """Return the daemon's gRPC target."""
        return "unix://" + str(self.socket_path)

    def start(self, timeout_s: float) -> None:
        """Start the daemon and wait until a client can connect, else raise DaemonError."""

        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "cacheserver",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address,
            *self.extra_args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
            )
        from cacheserver.launch import NotHealthy, wait_healthy

        proc = self.proc
        try:
            wait_healthy(self.address, timeout_s, still_starting=lambda: proc.poll() is None)
        except NotHealthy as exc:
            code = proc.poll()
            self.stop()
            status = f" (exit code {code})" if code is not None else ""
            raise DaemonError(f"{exc}{status}: {self.log_tail()}") from exc

    def alive(self) -> bool:
        """Whether the daemon process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the daemon and wait for it (SIGKILL after ``timeout_s``); return its code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, chars: int = 800) -> str:
        """Return the end of the daemon's combined stdout/stderr, on one line."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " ".join(text[-chars:].split())


def child_env() -> dict[str, str]:
    """Environment for subprocesses: quiet TensorFlow, repository root importable."""
    env = os.environ.copy()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass
class Benchmark:
    """Runs measurements one after another and collects their records."""

    args: argparse.Namespace
    scratch_root: Path
    socket_root: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    daemons: list[dict[str, Any]] = field(default_factory=list)
    done: int = 0

    @property
    def total(self) -> int:
        """Number of measurement processes planned."""
        sizes = sum(len(ns) for ns in self.args.size_plan.values())
        return sizes * len(self.args.strategies) * self.args.repeat

    def run_workload(self, name: str, sizes: tuple[int, ...]) -> None:
        """Measure every size and strategy of one workload.

        The cacheserver daemon is started once, right before the workload's first shardcache
        measurement, and stopped (SIGTERM, wait) when the workload is done or on any error.
        """
        daemon: Daemon | None = None
        daemon_info: dict[str, Any] | None = None
        try:
            for n in sizes:
                for strategy in self.args.strategies:
                    if strategy.startswith("shardcache") and daemon_info is None:
                        daemon = Daemon(
                            data_dir=self.scratch_root / f"cacheserver-{name}",
                            socket_path=self.socket_root / f"{name}.sock",
                            log_path=self.scratch_root / f"cacheserver-{name}.log",
                        )
                        daemon_info = start_daemon(daemon, self.args.daemon_timeout, name)
                        self.daemons.append(daemon_info)
                    runs: list[dict[str, Any]] = []
                    for repeat in range(self.args.repeat):
                        self.done += 1
                        print(
                            f"[{self.done}/{self.total}] {name} n={n:,} {strategy} "
                            f"(run {repeat + 1}/{self.args.repeat}) ...",
                            end=" ",
                            file=sys.stderr,
                            flush=True,
                        )
                        if not strategy.startswith("shardcache"):
                            run = self.measure(name, n, strategy, None, repeat)
                        elif daemon is not None and daemon.alive():
                            run = self.measure(name, n, strategy, daemon, repeat)
                        else:
                            reason = (daemon_info or {}).get(
                                "error"
                            ) or "cacheserver is not running"
                            run = {
                                "workload": name,
                                "n": n,
                                "strategy": strategy,
                                "status": "unavailable",
                                "error": reason,
                                "epochs": [],
                            }
                        add_derived(run)
                        runs.append(run)
                        print(progress_summary(run), file=sys.stderr, flush=True)
                        if run.get("status") != "ok":
                            break
                    self.records.append(representative(runs))
        finally:
            if daemon is not None and daemon_info is not None:
                daemon_info["exit_code"] = daemon.stop()
                shutil.rmtree(daemon.data_dir, ignore_errors=True)

    def measure(
        self, workload: str, n: int, strategy: str, daemon: Daemon | None, repeat: int,
        cache_name: str | None = None, extra_args: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Run one measurement subprocess and return its result record.

        With a daemon, its RssAnon is sampled and its data-dir growth recorded meanwhile.
        ``cache_name`` overrides the shardcache cache name; ``extra_args`` go to measure.py.
        """
        tmp_dir = Path(
            tempfile.mkdtemp(prefix=f"{workload}-{n}-{strategy}-", dir=self.scratch_root)
        )
        cmd = [
            sys.executable,
            str(MEASURE_SCRIPT),
            "--workload",
            workload,
            "--n",
            str(n),
            "--strategy",
            strategy,
            "--tmp-dir",
            str(tmp_dir),
            "--batch-size",
            str(self.args.batch_size),
            "--warmup-batches",
            str(self.args.warmup_batches),
        ]
        if self.args.cold:
            cmd.append("--cold")
        cmd += extra_args
        if daemon is not None:
            cmd += [
                "--socket",
                str(daemon.socket_path),
                "--cache-name",
                cache_name or f"{workload}-{n}-{strategy}-r{repeat}",
            ]
        base: dict[str, Any] = {
            "workload": workload,
            "n": n,
            "strategy": strategy,
            "repeat": repeat,
            "epochs": [],
        }
        daemon_sampler = RssSampler(daemon.proc.pid).start() if daemon and daemon.proc else None
        daemon_disk_before = directory_bytes(daemon.data_dir) if daemon else 0
        start = time.monotonic()
        try:
            proc = subprocess.run(
                cmd,
                cwd=REPO_ROOT,
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=self.args.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return base | {"status": "error", "error": f"timed out after {self.args.timeout} s"}
        finally:
            if daemon_sampler is not None:
                daemon_sampler.stop()
            shutil.rmtree(tmp_dir, ignore_errors=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        if not lines:
            tail = " ".join(proc.stderr[-800:].split())
            return base | {
                "status": "error",
                "error": f"exit code {proc.returncode}, no result: {tail}",
            }
        record: dict[str, Any] = json.loads(lines[-1][len(RESULT_PREFIX) :])
        record["process_seconds"] = time.monotonic() - start
        if daemon is not None and daemon_sampler is not None:
            record["daemon_peak_rss_anon_mb"] = kib_to_mb(daemon_sampler.peak_anon_kib)
            record["daemon_disk_bytes"] = directory_bytes(daemon.data_dir) - daemon_disk_before
        return record


def parse_sizes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``WORKLOAD=N[,N...]`` items."""
    sizes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or name not in WORKLOADS:
            raise argparse.ArgumentTypeError(
                f"bad --sizes item {item!r}: expected WORKLOAD=N[,N...] with WORKLOAD in "
                f"{sorted(WORKLOADS)}"
            )
        sizes[name] = tuple(int(v.replace("_", "")) for v in values.split(",") if v)
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the benchmark command line."""
    parser = argparse.ArgumentParser(
        description="Benchmark shardcache against tf.data caching; prints a markdown table."
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=[],
        metavar="WORKLOAD=N[,N...]",
        help="element counts per workload, e.g. image=1000,4000 small=200000 "
        "(overrides the default or --quick sizes of the named workloads)",
    )
    parser.add_argument(
        "--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(DEFAULT_WORKLOADS),
        help=f"default: {' '.join(DEFAULT_WORKLOADS)}; pixels and tokens (compressible) are "
        "for --cold runs",
    )
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES + EXTRA_STRATEGIES,
                        default=list(STRATEGIES))
    parser.add_argument(
        "--cold", action="store_true",
        help="drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches, needs root) right "
        "before epoch 2, so that it reads from the disk",
    )
    parser.add_argument(
        "--disk-read-mbps", type=float, default=None, metavar="MB_PER_S",
        help="limit reads from the disk under --tmp-dir to this many MB/s for the whole run "
        "(a block-I/O cgroup, needs root; bench/slow_disk.py): with --cold, epoch 2 reads "
        "from a disk of that speed instead of this VM's host-cached one",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="batch size for every strategy")
    parser.add_argument(
        "--warmup-batches",
        type=int,
        default=WARMUP_BATCHES,
        help="batches of zero elements each measurement process iterates before epoch 1",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measurement processes per row; the table shows the run with the median epoch-2 "
        "time and the min-max range of the epoch times",
    )
    parser.add_argument("--out", type=Path, default=None, help="write all raw results as JSON")
    parser.add_argument(
        "--tmp-dir", type=Path, default=None, help="where cache files go (default: system temp)"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds per measurement process"
    )
    parser.add_argument(
        "--daemon-timeout", type=float, default=60.0, help="seconds to wait for cacheserver"
    )
    args = parser.parse_args(argv)
    try:
        overrides = parse_sizes(args.sizes)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    args.size_plan = {
        name: overrides.get(
            name, WORKLOADS[name].quick_sizes if args.quick else WORKLOADS[name].sizes
        )
        for name in args.workloads
    }
    return args


def _first_line(path: str, prefix: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return f"{importlib.metadata.version(name)} ({name})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _git_revision() -> str | None:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + (" (uncommitted changes)" if dirty else "")


def machine_facts() -> dict[str, Any]:
    """Facts about the machine and software that the numbers depend on."""
    mem_total = _first_line("/proc/meminfo", "MemTotal:")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _first_line("/proc/cpuinfo", "model name"),
        "mem_total_gib": round(int(mem_total.split()[0]) / 2**20, 1) if mem_total else None,
        "python": platform.python_version(),
        "tensorflow": _dist_version("tensorflow", "tensorflow-cpu"),
        "numpy": _dist_version("numpy"),
        "platform": platform.platform(),
        "git_revision": _git_revision(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def reproducing_command() -> str:
    """Return this run's command line, paths relative to the repository root if possible."""

    def rel(path: str) -> str:
        try:
            return str(Path(path).absolute().relative_to(REPO_ROOT))
        except ValueError:
            return path

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


def render_header(facts: dict[str, Any], args: argparse.Namespace) -> str:
    """Markdown header: how to reproduce and on what."""
    sizes = "; ".join(
        f"{name}: " + ", ".join(f"{n:,}" for n in ns) for name, ns in args.size_plan.items()
    )
    lines = [
        "## shardcache benchmark",
        "",
        f"Reproduce (from the repository root): `{reproducing_command()}`",
        "",
        f"- Machine: nproc={facts['nproc']}, {facts['cpu_model']}, "
        f"{facts['mem_total_gib']} GiB RAM, {facts['platform']}",
        f"- Python {facts['python']}, TensorFlow {facts['tensorflow']}, numpy {facts['numpy']}",
        f"- Revision: {facts['git_revision'] or 'unknown'}; run at {facts['date_utc']}",
        f"- Sizes (elements): {sizes}; batch size {args.batch_size} after the cache op for "
        "every strategy",
        f"- Each measurement process first iterates {args.warmup_batches} untimed batches of "
        "zeros (at most as many elements as the dataset; heap and thread-pool warm-up) and "
        "runs `sync` (untimed) before each epoch"
        + ("; **epoch 2 is cold**: the page cache is dropped right before it (`--cold`), so "
           "it reads from the disk" if args.cold else "")
        + (f"; {args.slow_disk.describe()}, for every process of the run"
           if args.slow_disk else ""),
        f"- Load average (1/5/15 min) at start: {facts['loadavg']}",
        (
            f"- Each row: the median (by epoch-2 time) of {args.repeat} measurement processes; "
            "ranges in parentheses are min-max over them"
            if args.repeat > 1
            else "- Each row: one measurement process (use `--repeat N` for medians)"
        ),
        "- MB = 10^6 bytes of element payload (features + label); RssAnon in MB = 10^6 bytes",
        "",
    ]
    for name in args.size_plan:
        workload = WORKLOADS[name]
        lines.append(f"- `{name}`: {workload.description}")
    lines.append("")
    return "\n".join(lines)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """Turn SIGTERM into SystemExit, so that ``finally`` blocks stop the daemon and clean up."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run every measurement, print the markdown report and optionally write JSON."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that the cleanup below still runs
    args.slow_disk = None
    if args.disk_read_mbps is not None:
        try:
            args.slow_disk = SlowDisk(args.tmp_dir or Path(tempfile.gettempdir()),
                                      args.disk_read_mbps)
        except SlowDiskError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    with args.slow_disk or contextlib.nullcontext():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    facts = machine_facts()
    print(render_header(facts, args), flush=True)

    scratch_root = Path(tempfile.mkdtemp(prefix="shardcache-bench-", dir=args.tmp_dir))
    socket_root = Path(tempfile.mkdtemp(prefix="scb-"))  # short path: unix sockets are limited
    free = shutil.disk_usage(scratch_root).free
    need = max(
        (WORKLOADS[name].dataset_bytes(max(ns)) + WORKLOADS[name].dataset_bytes(sum(ns)))
        for name, ns in args.size_plan.items()
    )
    if free < need:
        print(
            f"warning: {free / GB:.1f} GB free in {scratch_root}, about {need / GB:.1f} GB needed",
            file=sys.stderr,
        )

    bench = Benchmark(args, scratch_root=scratch_root, socket_root=socket_root)
    started = time.monotonic()
    try:
        for name, sizes in args.size_plan.items():
            bench.run_workload(name, sizes)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
        shutil.rmtree(socket_root, ignore_errors=True)
    records, daemons = bench.records, bench.daemons

    add_ratios(records)
    print(render_table(records))
    print()
    print(render_notes(records, daemons))
    facts["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"- Load average (1/5/15 min) at the end: {facts['loadavg_end']}.")
    print(f"\nTotal benchmark wall time: {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.out is not None:
        payload = {
            "command": reproducing_command(),
            "machine": facts,
            "config": {
                "sizes": args.size_plan,
                "strategies": args.strategies,
                "batch_size": args.batch_size,
                "warmup_batches": args.warmup_batches,
                "repeat": args.repeat,
            },
            "records": records,
            "daemons": daemons,
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"raw results written to {args.out}", file=sys.stderr)
    return 0


def start_daemon(daemon: Daemon, timeout_s: float, workload: str) -> dict[str, Any]:
    """Start ``daemon`` and describe the outcome (never raises for a daemon failure)."""
    try:
        daemon.start(timeout_s)
    except Exception as exc:  # a missing or broken daemon must not stop the other strategies
        return {"workload": workload, "status": "unavailable", "error": f"cacheserver: {exc}"}
    assert daemon.proc is not None
    start_rss = RssSampler(daemon.proc.pid).sample()
    return {
        "workload": workload,
        "status": "ok",
        "error": None,
        "start_rss_anon_mb": kib_to_mb(start_rss),
    }


def progress_summary(record: dict[str, Any]) -> str:
    """One-line progress text for stderr."""
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('error')}"
    times = ", ".join(f"epoch{i} {e['seconds']:.2f}s" for i, e in enumerate(record["epochs"], 1))
    return f"ok ({times}, peak RssAnon {record['peak_rss_anon_mb']:,.0f} MB)"


if __name__ == "__main__":
    sys.exit(main())
