"""Scaling curves: epoch-2 throughput and peak memory vs dataset size, element size, parallelism.

Run from the repository root::

    .venv/bin/python bench/scaling.py --out scaling.json     # the docs/benchmarks.md run
    .venv/bin/python bench/scaling.py --quick                # smoke run, 3-5 minutes
    .venv/bin/python bench/scaling.py --client-option direct=true     # any cc.dataset() option

One daemon (``cacheserver serve --pythonpath bench``) holds the caches, in a temporary
directory under ``--tmp-dir`` that is removed at the end, on failure and on Ctrl-C. Every
point is one ``bench/measure.py`` process (two epochs; epoch 2 is reported; peak ``RssAnon``
of the process, and of the daemon sampled meanwhile), so the tf.data baselines and
shardcache are measured the same way as in ``bench/run.py``. Elements come from the cheap
``flat-*`` workloads (``bench/workloads.py``: random float32 rows copied from a pool, about
1 GB/s), so that writing tens of GB takes minutes, not the image pipeline's hours.

Sections (``--sections``):

* ``size``: 602 KB elements at ``--sizes-gib`` (default 1 4 26; the largest above this
  machine's RAM). shardcache caches are built by server-side materialization with
  ``--workers`` processes or by write-through (``--build``; ``auto`` builds the first size
  both ways, reports both write rates and builds the rest the faster way), then read by
  ``shardcache_read``. Baselines: ``ds.cache()`` while its projected peak stays under
  ``--memory-limit`` of RAM; ``cache(file)`` and ``save/load`` up to ``--baseline-max-gib``
  and while the disk has room. Sizes above RAM (``--cold-from-gib``) drop the page cache
  before epoch 2 and compare it with a plain sequential ``read()`` of the same shard files,
  cold, in the same run.
* ``element``: ``--element-total-gib`` of each ``--elements`` workload (1 KB to 2.4 MB).
* ``parallel``: ``parallel_shards`` in ``--parallel`` on the ``--parallel-gib`` cache of the
  size section, plus ``shuffle=True`` at ``--shuffle-parallel``.
* ``profile``: one epoch of that cache read with py-spy sampling the client and the daemon;
  CPU seconds of each process over the epoch and the hottest frames.

Prints markdown (docs/benchmarks.md, "Scaling curves") on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

from daemons import BenchDaemon  # noqa: E402
from machine import machine_facts, reproducing_command  # noqa: E402
from measure import parse_client_option  # noqa: E402
from report import GB, MB, add_derived  # noqa: E402
from run import Benchmark  # noqa: E402
from scaling_build import (  # noqa: E402
    PLAN_ENV,
    cold_sequential_read,
    materialize,
    project_build_seconds,
    project_rss,
)
from scaling_report import render  # noqa: E402
from workloads import FLAT_SHAPES, WORKLOADS  # noqa: E402

GIB = 1 << 30
SIZE_WORKLOAD = "flat-602k"
STRATEGIES = ("shardcache", "memory", "file", "save_load")
MEMORY_TOTAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _gib_to_n(workload: str, gib: float) -> int:
    return max(1, int(gib * GIB) // WORKLOADS[workload].element_bytes)


class Scaling:
    """Runs the sections one point at a time and keeps every record."""

    def __init__(self, args: argparse.Namespace, scratch: Path, socket_root: Path) -> None:
        self.args = args
        self.scratch = scratch
        ns = argparse.Namespace(batch_size=args.batch_size, warmup_batches=2, cold=False,
                                timeout=args.timeout, repeat=1, size_plan={})
        self.bench = Benchmark(ns, scratch_root=scratch, socket_root=socket_root)
        self.plan_file = scratch / "plan.json"
        os.environ[PLAN_ENV] = str(self.plan_file)  # the daemon's workers inherit it
        self.daemon = BenchDaemon(scratch / "daemon", socket_root / "d.sock",
                                  scratch / "daemon.log",
                                  extra_args=("--pythonpath", str(BENCH_DIR),
                                              "--materialize-allow", "scaling_build:flat_shard",
                                              "--log-level", "warning"))
        self.client_args = tuple(f"--client-option={k}={v}" for k, v in args.client_option)
        self.records: list[dict[str, Any]] = []
        self.builds: list[dict[str, Any]] = []
        self.ceilings: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.profile: dict[str, Any] | None = None
        self.build_method = "materialize" if args.build == "auto" else args.build

    # ------------------------------------------------------------------ one point

    def measure(self, section: str, workload: str, n: int, strategy: str, *,
                cache_name: str | None = None, extra: tuple[str, ...] = (),
                label: str = "", **facts: Any) -> dict[str, Any]:
        """One measure.py process; the record gets the section, a label and ``facts``."""
        _log(f"[{section}] {workload} n={n:,} {strategy} {label} ...")
        uses_daemon = strategy.startswith("shardcache")
        record = self.bench.measure(
            workload, n, strategy, self.daemon if uses_daemon else None, 0,
            cache_name=cache_name, extra_args=(*self.client_args, *extra) if uses_daemon
            else extra)
        add_derived(record)
        record.update(section=section, label=label, **facts)
        self.records.append(record)
        epochs = ", ".join(f"{e['seconds']:.2f}s" for e in record.get("epochs", []))
        _log(f"    {record.get('status')} {epochs} {record.get('error') or ''}")
        return record

    def skip(self, section: str, workload: str, n: int, strategy: str, why: str) -> None:
        _log(f"[{section}] {workload} n={n:,} {strategy}: skipped, {why}")
        self.skipped.append({"section": section, "workload": workload, "n": n,
                             "strategy": strategy, "why": why})

    # ------------------------------------------------------------------ shardcache caches

    def materialize(self, name: str, workload: str, n: int) -> dict[str, Any]:
        """Build cache ``name`` with ``--workers`` daemon workers; describe the build."""
        _log(f"[build] materialize {name}: {n:,} elements, {self.args.workers} workers ...")
        return materialize(self.daemon.address, self.plan_file, name, workload, n,
                           self.args.workers, self.args.shard_mib << 20)

    def build_and_read(self, section: str, gib: float, n: int) -> dict[str, Any] | None:
        """Build the shardcache cache of one size and measure reading it (epoch 2)."""
        workload = SIZE_WORKLOAD
        payload = n * WORKLOADS[workload].element_bytes
        above_ram = payload >= self.args.cold_from_gib * GIB
        free = shutil.disk_usage(self.scratch).free
        if free < 1.05 * payload + self.args.disk_headroom_gib * GIB:
            self.skip(section, workload, n, "shardcache",
                      f"{free / GB:.1f} GB free, {payload / GB:.1f} GB needed plus "
                      f"{self.args.disk_headroom_gib} GiB left for other users of the disk")
            return None
        cold = ("--cold",) if above_ram else ()
        name = f"size-{n}"
        if self.args.build == "auto" and not self.builds:  # the first size: both ways
            wt = self.measure(section, workload, n, "shardcache", cache_name=f"{name}-wt",
                              extra=cold, label="write-through", gib=gib)
            if wt.get("status") == "ok":
                self.builds.append({"name": f"{name}-wt", "n": n, "method": "write-through",
                                    "seconds": wt["epochs"][0]["seconds"],
                                    "payload_bytes": payload,
                                    "stored_bytes": wt.get("daemon_disk_bytes")})
            self._delete(f"{name}-wt")
            built = self.materialize(name, workload, n)
            self.builds.append(built)
            largest = max(self.args.sizes_gib) * GIB
            projected = project_build_seconds(self.builds, largest)
            _log(f"[build] projected seconds for {largest / GB:.1f} GB: {projected}")
            self.build_method = min(projected, key=lambda method: projected[method])
            _log(f"[build] the faster way, used for the larger sizes: {self.build_method}")
        elif self.build_method == "write-through":
            record = self.measure(section, workload, n, "shardcache", cache_name=name,
                                  extra=cold, gib=gib, label="write-through, cold epoch 2"
                                  if above_ram else "write-through")
            if record.get("status") == "ok":
                self.builds.append({"name": name, "n": n, "method": "write-through",
                                    "seconds": record["epochs"][0]["seconds"],
                                    "payload_bytes": payload,
                                    "stored_bytes": record.get("daemon_disk_bytes")})
                if above_ram:
                    self.ceiling(name, record)
            return record
        else:
            self.builds.append(self.materialize(name, workload, n))
        record = self.measure(section, workload, n, "shardcache_read", cache_name=name,
                              extra=cold, label="cold epoch 2" if above_ram else "", gib=gib)
        if above_ram and record.get("status") == "ok":
            self.ceiling(name, record)
        return record

    def ceiling(self, name: str, record: dict[str, Any]) -> None:
        """Beside a cold epoch 2: a cold plain read of the same shard files, now."""
        files = sorted(self.daemon.data_dir.glob(f"caches/{name}/shard-*/data.mdb"))
        _log(f"[ceiling] cold sequential read of {len(files)} shard files ...")
        moved, seconds = cold_sequential_read(files)
        epoch = record["epochs"][1]
        self.ceilings.append({"name": name, "n": record["n"], "file_bytes": moved,
                              "file_mb_per_s": moved / MB / seconds,
                              "epoch_payload_mb_per_s": epoch["mb_per_s"],
                              "epoch_file_mb_per_s": moved / MB / epoch["seconds"]})

    def _delete(self, name: str) -> None:
        from client import CacheClient
        from client.errors import CacheNotFoundError

        with CacheClient(self.daemon.address) as cc:
            try:
                cc.delete(name)
            except CacheNotFoundError:
                return
        path = self.daemon.data_dir / "caches" / name
        deadline = time.monotonic() + 120
        while path.exists() and time.monotonic() < deadline:  # removal runs in the background
            time.sleep(0.2)  # polling a condition with a deadline

    # ------------------------------------------------------------------ sections

    def size_section(self) -> None:
        memory_points: list[tuple[int, float]] = []  # (payload bytes, peak RssAnon MB)
        for gib in self.args.sizes_gib:
            n = _gib_to_n(SIZE_WORKLOAD, gib)
            payload = n * WORKLOADS[SIZE_WORKLOAD].element_bytes
            if "shardcache" in self.args.strategies:
                self.build_and_read("size", gib, n)
            for strategy in (s for s in self.args.strategies if s != "shardcache"):
                why = self._baseline_blocker(strategy, payload, memory_points)
                if why:
                    self.skip("size", SIZE_WORKLOAD, n, strategy, why)
                    continue
                record = self.measure("size", SIZE_WORKLOAD, n, strategy, gib=gib)
                if strategy == "memory" and record.get("status") == "ok":
                    memory_points.append((payload, record["peak_rss_anon_mb"]))
            if self._parallel_size() == gib:
                self.parallel_section(f"size-{n}", n)
                if "profile" in self.args.sections:
                    self.profile_section(f"size-{n}", n)
            self._delete(f"size-{n}")

    def _parallel_size(self) -> float | None:
        wanted = {"parallel", "profile"} & set(self.args.sections)
        return self.args.parallel_gib if wanted else None

    def _baseline_blocker(self, strategy: str, payload: int,
                          memory_points: list[tuple[int, float]]) -> str | None:
        limit = self.args.memory_limit * MEMORY_TOTAL
        if strategy == "memory":
            projected = project_rss(memory_points, payload)
            if projected is not None and projected * MB > limit:
                return (f"projected peak RssAnon {projected / 1000:,.1f} GB (linear in the "
                        f"smaller sizes) is over {self.args.memory_limit:.0%} of RAM "
                        f"({limit / GB:.1f} GB): ds.cache() would OOM or starve the machine")
            return None
        if payload > self.args.baseline_max_gib * GIB:
            return (f"above --baseline-max-gib {self.args.baseline_max_gib:g}: its files would "
                    f"take another {payload / GB:.0f} GB of a disk shared with other engineers "
                    "(and minutes to write)")
        free = shutil.disk_usage(self.scratch).free
        if free < 1.05 * payload + self.args.disk_headroom_gib * GIB:
            return f"{free / GB:.1f} GB free on the disk, {payload / GB:.1f} GB needed"
        return None

    def element_section(self) -> None:
        for workload in self.args.elements:
            n = _gib_to_n(workload, self.args.element_total_gib)
            for strategy in self.args.element_strategies:
                self.measure("element", workload, n, strategy, cache_name=f"el-{workload}")
            self._delete(f"el-{workload}")

    def parallel_section(self, name: str, n: int) -> None:
        if "parallel" not in self.args.sections:
            return
        points = [(k, False) for k in self.args.parallel]
        points += [(k, True) for k in self.args.shuffle_parallel]
        for k, shuffle in points:
            extra: tuple[str, ...] = (f"--client-option=parallel_shards={k}",)
            if shuffle:
                extra += ("--client-option=shuffle=true", "--client-option=seed=1")
            self.measure("parallel", SIZE_WORKLOAD, n, "shardcache_read", cache_name=name,
                         extra=extra, label=f"shuffle, k={k}" if shuffle else f"k={k}",
                         parallel_shards=k, shuffle=shuffle)

    def profile_section(self, name: str, n: int) -> None:
        from scaling_profile import profile_epoch

        _log(f"[profile] one epoch of {name} under py-spy ...")
        try:
            self.profile = profile_epoch(self.daemon, name, n, self.args.batch_size,
                                         self.args.client_option, self.scratch / "profile",
                                         self.args.profile_out)
        except Exception as exc:  # a missing py-spy must not lose the curves measured so far
            self.profile = {"error": f"{type(exc).__name__}: {exc}"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run (3-5 min): sizes 0.1 0.2 0.4 GiB (0.4 read cold), "
                        "elements flat-1k and flat-602k at 0.05 GiB, parallel 1 2 at 0.2 GiB")
    parser.add_argument("--sections", nargs="+", default=["size", "element", "parallel",
                                                          "profile"],
                        choices=["size", "element", "parallel", "profile"])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="what the size section compares")
    parser.add_argument("--client-option", action="append", default=[], metavar="KEY=VALUE",
                        type=parse_client_option,
                        help="keyword argument for every cc.cache()/cc.dataset() call, e.g. "
                        "direct=true (repeatable)")
    parser.add_argument("--sizes-gib", nargs="+", type=float, default=[1, 4, 26])
    parser.add_argument("--build", choices=["auto", "materialize", "write-through"],
                        default="auto", help="how the size section builds its caches")
    parser.add_argument("--cold-from-gib", type=float, default=MEMORY_TOTAL / GIB,
                        help="sizes from this many GiB read epoch 2 cold and measure the plain "
                        "read ceiling (default: this machine's RAM)")
    parser.add_argument("--workers", type=int, default=2, help="materialization workers")
    parser.add_argument("--shard-mib", type=int, default=512,
                        help="materialized shards hold about this much payload")
    parser.add_argument("--memory-limit", type=float, default=0.4,
                        help="skip ds.cache() where its projected peak exceeds this share of RAM")
    parser.add_argument("--baseline-max-gib", type=float, default=8.0,
                        help="largest size at which cache(file) and save/load run (disk)")
    parser.add_argument("--disk-headroom-gib", type=float, default=6.0,
                        help="free disk to leave for other users")
    parser.add_argument("--elements", nargs="+", choices=sorted(FLAT_SHAPES),
                        default=list(FLAT_SHAPES))
    parser.add_argument("--element-total-gib", type=float, default=1.0)
    parser.add_argument("--element-strategies", nargs="+",
                        choices=["shardcache", "memory", "file", "save_load"],
                        default=["shardcache", "save_load", "file"])
    parser.add_argument("--parallel", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--shuffle-parallel", nargs="*", type=int, default=[1, 4],
                        help="parallel_shards values also read with shuffle=True")
    parser.add_argument("--parallel-gib", type=float, default=4.0,
                        help="the size (one of --sizes-gib) the parallel and profile sections use")
    parser.add_argument("--profile-out", type=Path, default=None,
                        help="keep py-spy's raw (collapsed) stacks in this directory")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per point")
    parser.add_argument("--tmp-dir", type=Path, default=None,
                        help="where caches and baseline files go (a temp dir inside, removed)")
    parser.add_argument("--out", type=Path, default=None, help="all raw records as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes_gib, args.parallel_gib = [0.1, 0.2, 0.4], 0.2
        args.elements, args.element_total_gib = ["flat-1k", "flat-602k"], 0.05
        args.parallel, args.shuffle_parallel = [1, 2], [2]
        args.cold_from_gib = 0.35  # the 0.4 GiB size: exercises the cold epoch and the ceiling
    if "shardcache" not in args.strategies:
        args.sections = [s for s in args.sections if s not in ("parallel", "profile")]
    if {"parallel", "profile"} & set(args.sections) and (
            "size" not in args.sections or args.parallel_gib not in args.sizes_gib):
        parser.error(f"the parallel and profile sections read the size section's cache of "
                     f"--parallel-gib {args.parallel_gib:g} GiB: add 'size' to --sections and "
                     f"{args.parallel_gib:g} to --sizes-gib")
    return args


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # so that the finally below removes the caches


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    facts = machine_facts()
    facts["disk_free_gb_at_start"] = shutil.disk_usage(args.tmp_dir or tempfile.gettempdir()
                                                       ).free / GB
    scratch = Path(tempfile.mkdtemp(prefix="shardcache-scaling-", dir=args.tmp_dir))
    socket_root = Path(tempfile.mkdtemp(prefix="scs-"))  # short: unix socket paths are limited
    started = time.monotonic()
    try:
        run = Scaling(args, scratch, socket_root)
        if "shardcache" in args.strategies or "element" in args.sections:
            run.daemon.start(60.0)
        if "size" in args.sections:
            run.size_section()
        if "element" in args.sections:
            run.element_section()
    finally:
        if "run" in locals():
            run.daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(socket_root, ignore_errors=True)
    facts["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    facts["wall_seconds"] = time.monotonic() - started
    print(render(run, facts, reproducing_command()))
    if args.out is not None:
        args.out.write_text(json.dumps({
            "command": reproducing_command(), "machine": facts, "records": run.records,
            "builds": run.builds, "ceilings": run.ceilings, "skipped": run.skipped,
            "profile": run.profile}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
