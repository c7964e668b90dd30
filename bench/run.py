"""Reproduces docs/benchmarks.md's generated Results (make bench) and "Cold reads" (--cold).

shardcache against tf.data's own caches: every point in a process of its own, then the report.

Sections: ``throughput`` (every workload, size and strategy, two epochs, a daemon per workload),
``memory`` (602 KB elements of growing total size in a memory-limited cgroup, client and daemon
inside it; then the growth table: 1x, 4x and 10x of a base size written once each and read by
each read path, direct, data plane and gRPC, in a fresh process each, peak and end RssAnon) and
``store`` (``store.py``). Raw results go to ``--out``; ``render.py`` makes the
report from them: with ``--doc`` it rewrites that file's generated block and draws the plots
into its ``img/``, else prints it and draws them beside ``--out``. Progress goes to stderr.

    .venv/bin/python bench/run.py --doc docs/benchmarks.md        # make bench
    .venv/bin/python bench/run.py --quick                         # make bench-quick
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
from harness import BENCH_DIR, GIB, MB, REPO_ROOT, BenchDaemon, arguments, child_env, write_json
from measure import STRATEGIES, parse_client_option, run_point
from probes import RssSampler, kib_to_mb, machine_facts, reproducing_command
from render import default_img_dir, render_results
from report import add_derived, add_ratios, representative
from workloads import WORKLOADS

RESULTS_DIR = BENCH_DIR / "results"
THROUGHPUT_WORKLOADS = ("image", "small", "jpeg")
QUICK_WORKLOADS = ("image", "small")
BATCH_SIZE = 256
MEMORY_WORKLOAD = "flat-602k"
MEMORY_STRATEGIES = ("memory", "shardcache_plane", "shardcache_direct")
#: The strategies of the throughput tables unless --strategies says otherwise: gRPC reads
#: (``shardcache``) are what a client on the daemon's unix socket gets with direct=False.
DEFAULT_STRATEGIES = tuple(s for s in STRATEGIES if s != "shardcache")
MEMORY_LIMIT_GIB, QUICK_MEMORY_LIMIT_GIB = 2.0, 1.0
#: 256 elements of 602 KB are 154 MB a batch, and tf.data holds several: batches of 32 keep
#: the pipeline's own memory small beside the cache's, as image training batches are.
MEMORY_BATCH_SIZE = 32
MEMORY_SIZES_GIB = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
QUICK_MEMORY_SIZES_GIB = (0.25, 0.75, 1.5)
#: The growth table: multiples of a base size (bytes of elements), each read by every path.
GROWTH_BASE_BYTES, QUICK_GROWTH_BASE_BYTES = 256 * MB, 64 * MB
GROWTH_FACTORS = (1, 4, 10)
GROWTH_PATHS = ("shardcache_direct", "shardcache_plane", "shardcache")


class Benchmark:
    """Points measured one after another; a group's daemon starts for its first shardcache point
    (one that cannot start makes its points ``unavailable``) and stops with the group."""

    def __init__(self, args: argparse.Namespace, scratch: Path, sockets: Path, total: int) -> None:
        self.args, self.scratch, self.sockets, self.total = args, scratch, sockets, total
        self.records: list[dict[str, Any]] = []
        self.daemons: list[dict[str, Any]] = []
        self.done = 0

    @contextlib.contextmanager
    def group(self, workload: str, prefix: list[str] | None = None, tcp: bool = False) -> Any:
        """Points that share a daemon: ``measure(n, strategy)`` for each; tcp: the daemon
        also listens on TCP (``shardcache_plane`` reads)."""
        daemon: BenchDaemon | None = None
        info: dict[str, Any] = {"workload": workload, "status": "unavailable", "error": None}

        def measure(
            n: int,
            strategy: str,
            cache_name: str | None = None,
            batch_size: int = BATCH_SIZE,
            args: tuple[str, ...] = (),
            keep_cache: bool = False,
        ) -> dict[str, Any]:
            nonlocal daemon
            shardcache = strategy.startswith("shardcache")
            if shardcache and daemon is None:
                daemon = BenchDaemon(
                    self.sockets, workload, prefix=prefix or (), data_root=self.scratch, tcp=tcp
                )
                self.daemons.append(info)
                try:
                    daemon.start()
                    info.update(
                        status="ok", start_rss_anon_mb=kib_to_mb(RssSampler(daemon.pid).sample())
                    )
                except Exception as exc:  # the other strategies still run
                    info["error"] = f"cacheserver: {exc}"
            if shardcache and not daemon.alive():
                run = {
                    "workload": workload,
                    "n": n,
                    "strategy": strategy,
                    "epochs": [],
                    "status": "unavailable",
                    "error": info["error"] or "cacheserver is not running",
                }
            else:
                extra = [
                    *(["--cold"] if self.args.cold else []),
                    *(f"--client-option={k}={v}" for k, v in self.args.client_option),
                    *args,
                ]
                run = run_point(
                    workload,
                    n,
                    strategy,
                    scratch=self.scratch,
                    daemon=daemon if shardcache else None,
                    cache_name=cache_name,
                    batch_size=batch_size,
                    extra_args=extra,
                    prefix=prefix or (),
                    timeout_s=self.args.timeout,
                    keep_cache=keep_cache,
                )
            add_derived(run)
            return run

        try:
            yield measure
        finally:
            if daemon is not None:
                info["exit_code"] = daemon.stop()
                shutil.rmtree(daemon.data_dir, ignore_errors=True)

    def progress(self, text: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {text} ...", end=" ", file=sys.stderr, flush=True)

    def throughput(self, workload: str, sizes: tuple[int, ...]) -> None:
        """Every size and strategy of a workload, ``--repeat`` runs each (the median's kept)."""
        with self.group(workload, tcp="shardcache_plane" in self.args.strategies) as measure:
            for n in sizes:
                for strategy in self.args.strategies:
                    runs: list[dict[str, Any]] = []
                    for repeat in range(self.args.repeat):
                        self.progress(
                            f"{workload} n={n:,} {strategy} (run {repeat + 1}/{self.args.repeat})"
                        )
                        runs.append(measure(n, strategy, f"{workload}-{n}-{strategy}-r{repeat}"))
                        print(progress_summary(runs[-1]), file=sys.stderr, flush=True)
                        if runs[-1].get("status") != "ok":
                            break
                    self.records.append(representative(runs))

    def memory(self, cap: MemoryCap) -> None:
        """Every size and strategy inside ``cap``; a strategy OOM-killed at a size is not tried
        at larger ones."""
        workload = WORKLOADS[MEMORY_WORKLOAD]
        killed_at: dict[str, int] = {}
        with self.group(workload.name, cap.prefix(), tcp=True) as measure:
            for gib in self.args.memory_sizes_gib:
                n = max(1, int(gib * GIB) // workload.element_bytes)
                for strategy in MEMORY_STRATEGIES:
                    self.progress(
                        f"[memory, {cap.limit_bytes / GIB:g} GiB] {workload.name} "
                        f"{gib:g} GiB n={n:,} {strategy}"
                    )
                    if strategy in killed_at:
                        run = {
                            "workload": workload.name,
                            "n": n,
                            "strategy": strategy,
                            "status": "skipped",
                            "epochs": [],
                            "error": f"OOM-killed at {killed_at[strategy]:,} elements",
                        }
                    else:
                        oom_before = cap.oom_kills()
                        run = measure(n, strategy, batch_size=MEMORY_BATCH_SIZE)
                        if cap.oom_kills() > oom_before and run.get("status") != "ok":
                            run["status"] = "oom_killed"
                            killed_at[strategy] = n
                    run["dataset_gib"] = gib
                    print(progress_summary(run), file=sys.stderr, flush=True)
                    self.records.append(run)

    def growth(self, base_bytes: int) -> None:
        """Each multiple of base_bytes written once (direct writes, one epoch), then read for
        one epoch by each read path, ``--repeat`` times, every read in a fresh process; the
        last deletes the cache."""
        workload = WORKLOADS[MEMORY_WORKLOAD]
        with self.group(workload.name, tcp=True) as measure:
            for factor in GROWTH_FACTORS:
                n = max(1, factor * base_bytes // workload.element_bytes)
                name = f"growth-{n}"
                self.progress(f"[memory growth] {factor}x n={n:,} written")
                written = measure(
                    n,
                    "shardcache_direct",
                    name,
                    MEMORY_BATCH_SIZE,
                    ("--epochs", "1"),
                    keep_cache=True,
                )
                print(progress_summary(written), file=sys.stderr, flush=True)
                for strategy in GROWTH_PATHS:
                    for repeat in range(self.args.repeat):
                        self.progress(
                            f"[memory growth] {factor}x n={n:,} read by {strategy} "
                            f"(run {repeat + 1}/{self.args.repeat})"
                        )
                        last = strategy == GROWTH_PATHS[-1] and repeat == self.args.repeat - 1
                        run = (
                            measure(
                                n,
                                strategy,
                                name,
                                MEMORY_BATCH_SIZE,
                                ("--read-only",),
                                keep_cache=not last,
                            )
                            if written.get("status") == "ok"
                            else {
                                "workload": workload.name,
                                "n": n,
                                "strategy": strategy,
                                "status": "skipped",
                                "epochs": [],
                                "error": f"writing the cache failed: {written.get('error')}",
                            }
                        )
                        run |= {"factor": factor, "repeat": repeat}
                        print(progress_summary(run), file=sys.stderr, flush=True)
                        self.records.append(run)


def progress_summary(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('error')}"
    times = ", ".join(f"epoch{i} {e['seconds']:.2f}s" for i, e in enumerate(record["epochs"], 1))
    return f"ok ({times}, peak RssAnon {record['peak_rss_anon_mb']:,.0f} MB)"


def parse_sizes(item: str) -> tuple[str, tuple[int, ...]]:
    """``WORKLOAD=N[,N...]``."""
    name, sep, values = item.partition("=")
    if not sep or name not in WORKLOADS:
        raise argparse.ArgumentTypeError(
            f"bad --sizes item {item!r}: expected WORKLOAD=N[,N...], WORKLOAD one of "
            f"{sorted(WORKLOADS)}"
        )
    return name, tuple(int(v.replace("_", "")) for v in values.split(",") if v)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__, out=True, repeat=1)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (image, small; a 1 GiB memory cap), a few minutes",
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=("throughput", "memory", "store"),
        default=["throughput", "memory", "store"],
    )
    parser.add_argument(
        "--memory-parts",
        nargs="+",
        choices=("cap", "growth"),
        default=["cap", "growth"],
        help="the memory section's parts: the cgroup curve (root), the growth table by read path",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=sorted(WORKLOADS),
        help=f"default {' '.join(THROUGHPUT_WORKLOADS)} (--quick: "
        f"{' '.join(QUICK_WORKLOADS)}); pixels and tokens compress",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=[],
        type=parse_sizes,
        metavar="WORKLOAD=N[,N...]",
        help="element counts, e.g. image=1000,4000",
    )
    parser.add_argument(
        "--strategies", nargs="+", choices=STRATEGIES, default=list(DEFAULT_STRATEGIES)
    )
    parser.add_argument(
        "--client-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=parse_client_option,
        help="a keyword of cc.cache() in the shardcache strategies (repeatable)",
    )
    parser.add_argument(
        "--cold", action="store_true", help="drop the page cache before epoch 2 (root)"
    )
    parser.add_argument(
        "--disk-read-mbps",
        type=float,
        metavar="MB_PER_S",
        help="limit reads from --tmp-dir's disk to this rate for the whole run "
        "(root, a block-I/O cgroup)",
    )
    parser.add_argument("--doc", type=Path, help="rewrite this file's generated block")
    parser.add_argument("--tmp-dir", type=Path, help="where the caches go (default: system temp)")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds per measurement process"
    )
    args = parser.parse_args(argv)
    workloads = args.workloads or (QUICK_WORKLOADS if args.quick else THROUGHPUT_WORKLOADS)
    sizes = dict(args.sizes)
    args.size_plan = (
        {}
        if "throughput" not in args.sections
        else {
            name: sizes.get(name)
            or (WORKLOADS[name].quick_sizes if args.quick else WORKLOADS[name].sizes)
            for name in workloads
        }
    )
    args.memory_limit_gib = QUICK_MEMORY_LIMIT_GIB if args.quick else MEMORY_LIMIT_GIB
    args.memory_sizes_gib = QUICK_MEMORY_SIZES_GIB if args.quick else MEMORY_SIZES_GIB
    args.growth_base_bytes = QUICK_GROWTH_BASE_BYTES if args.quick else GROWTH_BASE_BYTES
    if args.out is None:
        args.out = RESULTS_DIR / ("quick.json" if args.quick else "latest.json")
    return args


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # so that the finally blocks stop the daemons


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args.slow_disk = None
    if args.disk_read_mbps is not None:
        try:
            args.slow_disk = SlowDisk(
                args.tmp_dir or Path(tempfile.gettempdir()), args.disk_read_mbps
            )
        except SlowDiskError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    with args.slow_disk or contextlib.nullcontext():
        payload = measure_all(args)
    write_json(args.out, payload)
    img_dir = default_img_dir(args.doc, args.out)
    markdown = render_results(payload, img_dir, args.doc)
    if args.doc is None:
        print(markdown)
    else:
        print(f"report written to {args.doc}, plots to {img_dir}", file=sys.stderr)
    return 0


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every section; everything as one JSON-able object."""
    facts = machine_facts(args.tmp_dir)
    scratch = Path(tempfile.mkdtemp(prefix="shardcache-bench-", dir=args.tmp_dir))
    sockets = Path(tempfile.mkdtemp(prefix="scb-"))  # short: a socket's path is limited
    bench = Benchmark(
        args,
        scratch,
        sockets,
        total=sum(map(len, args.size_plan.values())) * len(args.strategies) * args.repeat,
    )
    memory: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    started = time.monotonic()
    try:
        for name, sizes in args.size_plan.items():
            bench.throughput(name, sizes)
        if "memory" in args.sections:
            memory = memory_section(args, scratch, sockets)
        if "store" in args.sections:
            store = store_section(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(sockets, ignore_errors=True)
    add_ratios(bench.records)
    wall = time.monotonic() - started
    print(f"\nTotal benchmark wall time: {wall:.0f} s", file=sys.stderr)
    return {
        "command": reproducing_command(),
        "quick": args.quick,
        "machine": facts,
        "config": {
            "sizes": args.size_plan,
            "strategies": args.strategies,
            "batch_size": BATCH_SIZE,
            "repeat": args.repeat,
            "cold": args.cold,
            "client_options": dict(args.client_option),
            "slow_disk": args.slow_disk.describe() if args.slow_disk else None,
        },
        "records": bench.records,
        "daemons": bench.daemons,
        "memory": memory,
        "store": store,
        "wall_seconds": round(wall),
    }


def memory_section(args: argparse.Namespace, scratch: Path, sockets: Path) -> dict[str, Any]:
    """The memory section: the curve in its cgroup (or why it could not run), then the growth
    table (no cgroup: it needs no root)."""
    section: dict[str, Any] = {
        "workload": MEMORY_WORKLOAD,
        "limit_bytes": int(args.memory_limit_gib * GIB),
        "sizes_gib": list(args.memory_sizes_gib),
        "strategies": list(MEMORY_STRATEGIES),
        "records": [],
        "batch_size": MEMORY_BATCH_SIZE,
    }
    if "cap" not in args.memory_parts:
        section["error"] = "not asked for (--memory-parts)"
    else:
        try:
            cap = MemoryCap(section["limit_bytes"])
        except MemoryCapError as exc:
            print(f"memory section's cgroup curve skipped: {exc}", file=sys.stderr)
            section["error"] = str(exc)
        else:
            with cap:
                bench = Benchmark(
                    args,
                    scratch,
                    sockets,
                    total=len(args.memory_sizes_gib) * len(MEMORY_STRATEGIES),
                )
                bench.memory(cap)
            section |= {
                "cgroup": cap.describe(),
                "records": bench.records,
                "daemons": bench.daemons,
            }
    if "growth" in args.memory_parts:
        bench = Benchmark(
            args,
            scratch,
            sockets,
            total=len(GROWTH_FACTORS) * (1 + len(GROWTH_PATHS) * args.repeat),
        )
        bench.growth(args.growth_base_bytes)
        section["growth"] = {
            "base_bytes": args.growth_base_bytes,
            "factors": list(GROWTH_FACTORS),
            "paths": list(GROWTH_PATHS),
            "batch_size": MEMORY_BATCH_SIZE,
            "repeat": args.repeat,
            "records": bench.records,
            "daemons": bench.daemons,
        }
    return section


def store_section(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``store.py`` (``--full`` unless ``--quick``) in its own process: its results, or why not."""
    print("[store] the object-store tier (bench/store.py) ...", file=sys.stderr, flush=True)
    out = scratch / "store.json"
    cmd = [
        sys.executable,
        str(BENCH_DIR / "store.py"),
        "--out",
        str(out),
        "--no-report",
        "--tmp-dir",
        str(scratch),
        "--timeout",
        str(min(args.timeout, 600.0)),
        *([] if args.quick else ["--full"]),
    ]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            timeout=args.timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"bench/store.py timed out after {args.timeout:g} s"}
    if not out.exists():
        return {"error": f"bench/store.py exited with {proc.returncode} and wrote no results"}
    section: dict[str, Any] = json.loads(out.read_text())
    return section


if __name__ == "__main__":
    sys.exit(main())
