"""Benchmark shardcache against tf.data's own caching options; write the results and report.

Run from the repository root (``make bench`` and ``make bench-quick`` do)::

    .venv/bin/python bench/run.py --doc docs/benchmarks.md        # the full run: the report
    .venv/bin/python bench/run.py --quick                         # prints the report instead
    .venv/bin/python bench/run.py --sections throughput --workloads small --sizes small=200000

Three sections, every point in its own process (``measure.py``): ``throughput``, every
workload, size and strategy, epoch 1 (filling the cache) and epoch 2 (reading it), one daemon
per workload; ``memory``, ``ds.cache()`` and shardcache on 602 KB elements of growing total
size in a memory-limited cgroup (``cgroups.py``), client and daemon inside it, past the
limit; ``store``, the object store tier (``store.py``, one process).

All raw results go to ``--out`` (JSON, default ``bench/results/latest.json``, with
``--quick`` ``bench/results/quick.json``). ``render.py`` turns them into the report: with
``--doc PATH`` its generated block in PATH is rewritten and the plots go to ``--img-dir``
(default ``docs/img``); without it the markdown goes to stdout and the plots beside ``--out``.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cgroups import MemoryCap, MemoryCapError, SlowDisk, SlowDiskError
from harness import (
    BENCH_DIR,
    GB,
    GIB,
    REPO_ROOT,
    BenchDaemon,
    RssSampler,
    child_env,
    kib_to_mb,
    machine_facts,
    reproducing_command,
)
from measure import (
    EXTRA_STRATEGIES,
    STRATEGIES,
    WARMUP_BATCHES,
    parse_client_option,
    run_point,
)
from render import render_results
from report import add_derived, add_ratios, representative
from workloads import WORKLOADS

RESULTS_DIR = BENCH_DIR / "results"

#: What ``run.py`` measures unless --workloads says otherwise (full run / --quick).
THROUGHPUT_WORKLOADS = ("image", "small", "jpeg")
QUICK_WORKLOADS = ("image", "small")
QUICK_SIZES = {"image": (256,), "small": (40_000,)}
MEMORY_WORKLOAD = "flat-602k"
MEMORY_STRATEGIES = ("memory", "shardcache", "shardcache_direct")
MEMORY_LIMIT_GIB, QUICK_MEMORY_LIMIT_GIB = 2.0, 1.0
#: A batch of 256 elements of 602 KB is 154 MB, and tf.data holds several: batches of 32
#: keep the pipeline's own memory small beside the cache's, as image training batches are.
MEMORY_BATCH_SIZE = 32
MEMORY_SIZES_GIB = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
QUICK_MEMORY_SIZES_GIB = (0.25, 0.75, 1.5)


class Benchmark:
    """Runs measurements one after another and collects their records."""

    def __init__(self, args: argparse.Namespace, scratch_root: Path, socket_root: Path,
                 total: int = 0) -> None:
        self.args = args
        self.scratch_root = scratch_root
        self.socket_root = socket_root
        self.records: list[dict[str, Any]] = []
        self.daemons: list[dict[str, Any]] = []
        self.done = 0
        self.total = total

    def start_daemon(self, name: str, workload: str, prefix: tuple[str, ...] = ()
                     ) -> tuple[BenchDaemon, dict[str, Any]]:
        """Start a daemon of its own; it and what became of it (never raises for a failure)."""
        daemon = BenchDaemon(data_dir=self.scratch_root / f"cacheserver-{name}",
                             socket_path=self.socket_root / f"{name}.sock",
                             log_path=self.scratch_root / f"cacheserver-{name}.log",
                             prefix=prefix)
        try:
            daemon.start(self.args.daemon_timeout)
            info = {"workload": workload, "status": "ok", "error": None,
                    "start_rss_anon_mb": kib_to_mb(RssSampler(daemon.pid).sample())}
        except Exception as exc:  # a missing or broken daemon must not stop the other strategies
            info = {"workload": workload, "status": "unavailable", "error": f"cacheserver: {exc}"}
        self.daemons.append(info)
        return daemon, info

    def stop_daemon(self, daemon: BenchDaemon | None, info: dict[str, Any] | None) -> None:
        if daemon is not None and info is not None:
            info["exit_code"] = daemon.stop()
            shutil.rmtree(daemon.data_dir, ignore_errors=True)

    def run_workload(self, name: str, sizes: tuple[int, ...]) -> None:
        """Measure every size and strategy of one workload (the throughput section).

        The cacheserver daemon is started once, right before the workload's first shardcache
        measurement, and stopped (SIGTERM, wait) when the workload is done or on any error.
        """
        daemon: BenchDaemon | None = None
        info: dict[str, Any] | None = None
        try:
            for n in sizes:
                for strategy in self.args.strategies:
                    if strategy.startswith("shardcache") and info is None:
                        daemon, info = self.start_daemon(name, name)
                    runs: list[dict[str, Any]] = []
                    for repeat in range(self.args.repeat):
                        self.progress(f"{name} n={n:,} {strategy} "
                                      f"(run {repeat + 1}/{self.args.repeat})")
                        run = self.measure(name, n, strategy, daemon, info,
                                           cache_name=f"{name}-{n}-{strategy}-r{repeat}")
                        runs.append(run)
                        print(progress_summary(run), file=sys.stderr, flush=True)
                        if run.get("status") != "ok":
                            break
                    self.records.append(representative(runs))
        finally:
            self.stop_daemon(daemon, info)

    def run_memory(self, cap: MemoryCap) -> None:
        """The memory section: every size and strategy inside ``cap``, daemon included.

        Once ``ds.cache()`` is OOM-killed at a size, the larger sizes are not tried with it.
        """
        args = self.args
        workload = WORKLOADS[args.memory_workload]
        daemon: BenchDaemon | None = None
        info: dict[str, Any] | None = None
        killed_at: dict[str, int] = {}
        try:
            for gib in args.memory_sizes_gib:
                n = max(1, int(gib * GIB) // workload.element_bytes)
                for strategy in args.memory_strategies:
                    if strategy.startswith("shardcache") and info is None:
                        daemon, info = self.start_daemon("memory", workload.name,
                                                         tuple(cap.prefix()))
                    self.progress(f"[memory, {cap.limit_bytes / GIB:g} GiB] {workload.name} "
                                  f"{gib:g} GiB n={n:,} {strategy}")
                    if strategy in killed_at:
                        run = {"workload": workload.name, "n": n, "strategy": strategy,
                               "status": "skipped", "epochs": [],
                               "error": f"OOM-killed at {killed_at[strategy]:,} elements"}
                    else:
                        oom_before = cap.oom_kills()
                        run = self.measure(workload.name, n, strategy, daemon, info,
                                           prefix=cap.prefix(),
                                           batch_size=args.memory_batch_size)
                        if cap.oom_kills() > oom_before and run.get("status") != "ok":
                            run["status"] = "oom_killed"
                            killed_at[strategy] = n
                        if daemon is not None and strategy.startswith("shardcache"):
                            delete_cache(daemon, run.get("cache_name"))
                    run["dataset_gib"] = gib
                    print(progress_summary(run), file=sys.stderr, flush=True)
                    self.records.append(run)
        finally:
            self.stop_daemon(daemon, info)

    def progress(self, text: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {text} ...", end=" ", file=sys.stderr, flush=True)

    def measure(self, workload: str, n: int, strategy: str, daemon: BenchDaemon | None,
                info: dict[str, Any] | None, cache_name: str | None = None,
                prefix: list[str] | tuple[str, ...] = (),
                batch_size: int | None = None) -> dict[str, Any]:
        """Measure one point (measure.py), or say why a shardcache point cannot run."""
        args = self.args
        if strategy.startswith("shardcache") and (daemon is None or not daemon.alive()):
            run = {"workload": workload, "n": n, "strategy": strategy, "status": "unavailable",
                   "error": (info or {}).get("error") or "cacheserver is not running",
                   "epochs": []}
        else:
            extra = [*(["--cold"] if args.cold else []),
                     *(f"--client-option={k}={v}" for k, v in args.client_option)]
            run = run_point(workload, n, strategy, scratch=self.scratch_root,
                            daemon=daemon if strategy.startswith("shardcache") else None,
                            cache_name=cache_name, batch_size=batch_size or args.batch_size,
                            warmup_batches=args.warmup_batches, extra_args=extra,
                            prefix=prefix, timeout_s=args.timeout)
        add_derived(run)
        return run


def delete_cache(daemon: BenchDaemon, name: str | None) -> None:
    """Delete a measured cache from the daemon, so that the disk holds one at a time."""
    if name is None or not daemon.alive():
        return
    from client import CacheClient

    try:
        with CacheClient(daemon.address) as cc:
            cc.delete(name)
    except Exception as exc:  # a cache left behind costs disk space, not correctness
        print(f"(could not delete cache {name}: {exc})", file=sys.stderr)


def progress_summary(record: dict[str, Any]) -> str:
    """One-line progress text for stderr."""
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('error')}"
    times = ", ".join(f"epoch{i} {e['seconds']:.2f}s" for i, e in enumerate(record["epochs"], 1))
    return f"ok ({times}, peak RssAnon {record['peak_rss_anon_mb']:,.0f} MB)"


def parse_sizes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``WORKLOAD=N[,N...]`` items."""
    sizes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or name not in WORKLOADS:
            raise argparse.ArgumentTypeError(
                f"bad --sizes item {item!r}: expected WORKLOAD=N[,N...] with WORKLOAD in "
                f"{sorted(WORKLOADS)}")
        sizes[name] = tuple(int(v.replace("_", "")) for v in values.split(",") if v)
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the benchmark command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (image, small; a 1 GiB memory cap), a few minutes")
    parser.add_argument("--sections", nargs="+", choices=("throughput", "memory", "store"),
                        default=["throughput", "memory", "store"])
    parser.add_argument(
        "--sizes", nargs="+", default=[], metavar="WORKLOAD=N[,N...]",
        help="element counts per workload, e.g. image=1000,4000 small=200000 "
        "(overrides the default or --quick sizes of the named workloads)")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=None,
                        help=f"throughput section; default: {' '.join(THROUGHPUT_WORKLOADS)} "
                        f"(--quick: {' '.join(QUICK_WORKLOADS)}); pixels and tokens "
                        "(compressible) are for --cold runs")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES + EXTRA_STRATEGIES,
                        default=list(STRATEGIES), help="throughput section")
    parser.add_argument("--client-option", action="append", default=[], metavar="KEY=VALUE",
                        type=parse_client_option,
                        help="throughput section: keyword argument for cc.cache() in the "
                        "shardcache strategies (repeatable), e.g. parallel_shards=4, "
                        "shuffle=true, direct=auto")
    parser.add_argument("--memory-limit-gib", type=float, default=None,
                        help=f"memory section: the cgroup's limit (default {MEMORY_LIMIT_GIB:g}, "
                        f"--quick {QUICK_MEMORY_LIMIT_GIB:g})")
    parser.add_argument("--memory-sizes-gib", type=float, nargs="+", default=None,
                        help="memory section: dataset sizes in GiB (default "
                        f"{' '.join(map(str, MEMORY_SIZES_GIB))}; --quick "
                        f"{' '.join(map(str, QUICK_MEMORY_SIZES_GIB))})")
    parser.add_argument("--memory-strategies", nargs="+", default=list(MEMORY_STRATEGIES),
                        choices=STRATEGIES)
    parser.add_argument("--memory-workload", default=MEMORY_WORKLOAD, choices=sorted(WORKLOADS))
    parser.add_argument("--memory-batch-size", type=int, default=MEMORY_BATCH_SIZE,
                        help="memory section: batch size after the cache op")
    parser.add_argument(
        "--cold", action="store_true",
        help="drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches, needs root) right "
        "before epoch 2, so that it reads from the disk")
    parser.add_argument(
        "--disk-read-mbps", type=float, default=None, metavar="MB_PER_S",
        help="limit reads from the disk under --tmp-dir to this many MB/s for the whole run "
        "(a block-I/O cgroup, needs root; bench/cgroups.py): with --cold, epoch 2 reads "
        "from a disk of that speed instead of this VM's host-cached one")
    parser.add_argument("--batch-size", type=int, default=256, help="batch size for every strategy")
    parser.add_argument(
        "--warmup-batches", type=int, default=WARMUP_BATCHES,
        help="batches of zero elements each measurement process iterates before epoch 1")
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="throughput section: measurement processes per row; the report shows the run with "
        "the median epoch-2 time and the min-max range of the epoch times")
    parser.add_argument("--out", type=Path, default=None,
                        help="raw results (JSON); default bench/results/latest.json, with "
                        "--quick bench/results/quick.json")
    parser.add_argument("--doc", type=Path, default=None,
                        help="rewrite the generated block of this markdown file (e.g. "
                        "docs/benchmarks.md) instead of printing the report")
    parser.add_argument("--img-dir", type=Path, default=None,
                        help="where the plots go (default: docs/img with --doc, else beside "
                        "--out)")
    parser.add_argument("--tmp-dir", type=Path, default=None,
                        help="where cache files go (default: system temp)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds per measurement process")
    parser.add_argument("--daemon-timeout", type=float, default=60.0,
                        help="seconds to wait for cacheserver")
    args = parser.parse_args(argv)
    try:
        overrides = parse_sizes(args.sizes)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.workloads is None:
        args.workloads = list(QUICK_WORKLOADS if args.quick else THROUGHPUT_WORKLOADS)
    default_sizes = {name: QUICK_SIZES.get(name, WORKLOADS[name].quick_sizes) if args.quick
                     else WORKLOADS[name].sizes for name in args.workloads}
    args.size_plan = {name: overrides.get(name, default_sizes[name]) for name in args.workloads}
    if "throughput" not in args.sections:
        args.size_plan = {}
    if args.memory_limit_gib is None:
        args.memory_limit_gib = QUICK_MEMORY_LIMIT_GIB if args.quick else MEMORY_LIMIT_GIB
    if args.memory_sizes_gib is None:
        args.memory_sizes_gib = list(QUICK_MEMORY_SIZES_GIB if args.quick else MEMORY_SIZES_GIB)
    if args.out is None:
        args.out = RESULTS_DIR / ("quick.json" if args.quick else "latest.json")
    if args.img_dir is None:
        args.img_dir = (args.doc.parent / "img" if args.doc is not None
                        else args.out.with_name(args.out.stem + "-img"))
    return args


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """Turn SIGTERM into SystemExit, so that ``finally`` blocks stop the daemon and clean up."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run every measurement, write the JSON, then the report."""
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
        payload = _run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"raw results written to {args.out}", file=sys.stderr)
    markdown = render_results(payload, args.img_dir, args.doc)
    if args.doc is None:
        print(markdown)
    else:
        print(f"report written to {args.doc}, plots to {args.img_dir}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure both sections; return everything as one JSON-able object."""
    facts = machine_facts(args.tmp_dir)
    for key in ("loadavg", "date_utc"):  # not what the numbers depend on
        facts.pop(key, None)
    scratch_root = Path(tempfile.mkdtemp(prefix="shardcache-bench-", dir=args.tmp_dir))
    socket_root = Path(tempfile.mkdtemp(prefix="scb-"))  # short path: unix sockets are limited
    need = max([WORKLOADS[name].dataset_bytes(max(ns) + sum(ns))
                for name, ns in args.size_plan.items()] + [0])
    free = shutil.disk_usage(scratch_root).free
    if free < need:
        print(f"warning: {free / GB:.1f} GB free in {scratch_root}, about {need / GB:.1f} GB "
              "needed", file=sys.stderr)
    bench = Benchmark(args, scratch_root=scratch_root, socket_root=socket_root)
    memory_on = "memory" in args.sections
    bench.total = (sum(len(ns) for ns in args.size_plan.values()) * len(args.strategies)
                   * args.repeat)
    memory: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    started = time.monotonic()
    try:
        for name, sizes in args.size_plan.items():
            bench.run_workload(name, sizes)
        if memory_on:
            memory = _memory_section(args, scratch_root, socket_root)
        if "store" in args.sections:
            store = _store_section(args, scratch_root)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
        shutil.rmtree(socket_root, ignore_errors=True)
    add_ratios(bench.records)
    wall = time.monotonic() - started
    print(f"\nTotal benchmark wall time: {wall:.0f} s", file=sys.stderr)
    return {
        "command": reproducing_command(),
        "quick": args.quick,
        "machine": facts,
        "config": {"sizes": args.size_plan, "strategies": args.strategies,
                   "batch_size": args.batch_size, "warmup_batches": args.warmup_batches,
                   "repeat": args.repeat, "cold": args.cold,
                   "client_options": dict(args.client_option),
                   "slow_disk": args.slow_disk.describe() if args.slow_disk else None},
        "records": bench.records,
        "daemons": bench.daemons,
        "memory": memory,
        "store": store,
        "wall_seconds": round(wall),
    }


def _memory_section(args: argparse.Namespace, scratch_root: Path,
                    socket_root: Path) -> dict[str, Any]:
    """Run the memory section in its own cgroup; its records, or why it could not run."""
    section: dict[str, Any] = {"workload": args.memory_workload,
                               "limit_bytes": int(args.memory_limit_gib * GIB),
                               "sizes_gib": args.memory_sizes_gib,
                               "strategies": args.memory_strategies, "records": [],
                               "batch_size": args.memory_batch_size,
                               "daemons": []}
    try:
        cap = MemoryCap(section["limit_bytes"])
    except MemoryCapError as exc:
        print(f"memory section skipped: {exc}", file=sys.stderr)
        return section | {"error": str(exc)}
    with cap:
        bench = Benchmark(args, scratch_root=scratch_root, socket_root=socket_root,
                          total=len(args.memory_sizes_gib) * len(args.memory_strategies))
        bench.run_memory(cap)
    return section | {"cgroup": cap.describe(), "records": bench.records,
                      "daemons": bench.daemons}


def _store_section(args: argparse.Namespace, scratch_root: Path) -> dict[str, Any]:
    """Run ``store.py`` (full or quick sizes) in its own process; its results, or why not."""
    out = scratch_root / "store.json"
    cmd = [sys.executable, str(BENCH_DIR / "store.py"), "--out", str(out), "--no-report",
           "--tmp-dir", str(scratch_root), "--timeout", str(min(args.timeout, 600.0))]
    if not args.quick:
        cmd.append("--full")
    print("[store] the object-store tier (bench/store.py) ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                              timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"bench/store.py timed out after {args.timeout:g} s"}
    if not out.exists():
        return {"error": f"bench/store.py exited with {proc.returncode} and wrote no results"}
    section: dict[str, Any] = json.loads(out.read_text())
    return section


if __name__ == "__main__":
    sys.exit(main())
