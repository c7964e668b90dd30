"""Reproduces docs/benchmarks.md, "Scale": a daemon's costs against caches and shards, and epochs.

    .venv/bin/python bench/scale.py                      # both sections, the default points
    .venv/bin/python bench/scale.py --quick              # small points: checks that it works

Section ``daemon``: for each point CxS of ``--points`` (C caches of S shards each), a fresh
``cacheserver serve`` (bench/harness.py's BenchDaemon) gets C caches written through its
WriteCache RPC, each shard ``--elements-per-shard`` int64 elements (one WriteChunk per
shard, ``WriteBegin.shard_bytes`` 1: every chunk is a shard of its own), ``--writers``
caches at a time. Then the daemon is stopped and started again over the same data dir and
measured: start-up to a SERVING health check; ``ListCaches`` (``cc.list()``) and
``GetCache`` of the largest cache (``cc.info()``), the median of ``--repeat`` calls, and the
bytes of each answer (``list_bytes``, ``info_bytes``); the
``cacheserver ls`` and ``cacheserver info NAME`` commands, wall time of the whole process;
the daemon's ``VmRSS`` and ``RssAnon``, its open file descriptors (``/proc/PID/fd``) and
memory maps (lines of ``/proc/PID/maps``); once after the start, once after every cache
was read once over gRPC (``cc.numpy(direct=False)``, every shard opened by the daemon; each
read checked for its element count and sum). ``--daemon-nofile N`` starts the daemon under
``prlimit --nofile=N`` (a fd limit below the shard count). The machine's limits
(``ulimit -n``, ``vm.max_map_count``) are recorded beside each point. Writing and reading
each cost a few ms per shard (two fsyncs a shard; a ReadShard call a shard): a point of
100,000 shards takes several minutes of each, the default points an hour or more.

Section ``epochs``: for each size of ``--sizes`` and element kind of ``--elements`` (``1k``:
1 KiB uint8 rows; ``image``: 224x224x3 uint8), the same random elements (rows of a fixed
pool, incompressible) are written once by each strategy and read for a cold epoch (the page
cache dropped first) and a warm one (right after): ``shardcache`` (``cc.cache()``'s first
epoch writes, ``cc.dataset()`` reads, direct on this host), tf.data's ``snapshot(path)``
and ``cache(filename)`` (``--strategies``); beside each, ``cat`` of that strategy's own
files to /dev/null, cold and warm, the raw sequential read of the same bytes. A strategy's
files are removed before the next one writes: the disk needs room for one copy. Dropping
the page cache needs root; without it the cold rows are skipped, with a note. Epochs of
``batch(256)``, timed to the last batch, the element count checked; each row has this
process's peak RssAnon over its strategy's write and reads, and is saved as it is done.

Progress goes to stderr, raw results to ``--out`` (default bench/results/scale.json).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import BENCH_DIR, BenchDaemon, arguments, child_env, write_json
from probes import RssSampler, drop_page_cache, machine_facts, reproducing_command

from client import CacheClient
from tests.sharded import write_tiny_shards

DEFAULT_POINTS = "10x10,100x1,10x1000,100x100,1000x10,100x1000,1000x100,1x100000,10x10000"
QUICK_POINTS = "10x10,100x1,10x100,1x1000"
DEFAULT_SIZES = "2GiB"
QUICK_SIZES = "32MiB"
ELEMENT_SHAPES = {"1k": (1024,), "image": (224, 224, 3)}
STRATEGIES = ("shardcache", "snapshot", "cache_file")
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_UNITS.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})


def log(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- arguments
def parse_points(text: str) -> list[tuple[int, int]]:
    """ "10x100,1x1000" -> [(10, 100), (1, 1000)]: caches x shards per cache, each >= 1."""
    points = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        match = re.fullmatch(r"(\d+)x(\d+)", item)
        if match is None or min(int(match[1]), int(match[2])) < 1:
            raise argparse.ArgumentTypeError(
                f"point {item!r}: write CACHESxSHARDS with both at least 1, e.g. 100x1000"
            )
        points.append((int(match[1]), int(match[2])))
    if not points:
        raise argparse.ArgumentTypeError("no points given: e.g. 10x10,100x1000")
    return points


def parse_size(text: str) -> int:
    """ "2GiB" -> 2147483648, "500MB" -> 500000000, "4096" -> 4096 (bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match[2].lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: write a number and a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    return int(float(match[1]) * _UNITS[unit])


def parse_sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def _choices(text: str, allowed: Sequence[str], what: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    bad = [k for k in chosen if k not in allowed]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(
            f"{what} {bad or text!r}: choose from {', '.join(allowed)}"
        )
    return chosen


def parse_elements(text: str) -> list[str]:
    return _choices(text, list(ELEMENT_SHAPES), "element kinds")


def parse_strategies(text: str) -> list[str]:
    return _choices(text, STRATEGIES, "strategies")


# ---------------------------------------------------------------------- /proc probes
def process_facts(pid: int | str) -> dict[str, Any]:
    """A process's resident memory (VmRSS, RssAnon, in KiB), open fds, memory maps and fd
    limit, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    limit = next(
        line.split()[3]
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
        if line.startswith("Max open files")
    )
    with open(f"/proc/{pid}/maps", "rb") as maps:
        map_count = sum(1 for _ in maps)
    return {
        "vm_rss_kib": int(fields["VmRSS"].split()[0]),
        "rss_anon_kib": int(fields["RssAnon"].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "maps": map_count,
        "fd_limit": int(limit) if limit.isdigit() else limit,
    }


def system_limits() -> dict[str, Any]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "ulimit_n": soft,
        "ulimit_n_hard": hard,
        "vm_max_map_count": int(Path("/proc/sys/vm/max_map_count").read_text()),
    }


# ---------------------------------------------------------------------- the daemon section
def build_cache(cc: CacheClient, name: str, shards: int, per_shard: int) -> int:
    """Write cache name of shards shards, per_shard int64 elements each, through WriteCache:
    one chunk per shard (tests/sharded.py). Returns the sum of its elements (0, 1, 2, ...)."""
    write_tiny_shards(cc, name, shards, per_shard)
    n = shards * per_shard
    return n * (n - 1) // 2


def _median_s(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _command_s(daemon: BenchDaemon, *args: str) -> float:
    """Wall seconds of one ``cacheserver ARGS --target`` process (interpreter start included)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "cacheserver", *args, "--target", daemon.target],
        env=child_env(safe_path=True),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=True,
    )
    return time.perf_counter() - start


def _response_bytes(daemon: BenchDaemon, largest: str) -> dict[str, int]:
    """Serialized bytes of the ListCaches answer cc.list() gets (the BASIC view, no shards)
    and of GetCache of the largest cache (every shard)."""
    import grpc

    from client.wire.v1 import cache_service_pb2 as pb
    from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

    limit = [("grpc.max_receive_message_length", 256 << 20)]
    with grpc.insecure_channel(daemon.target, options=limit) as channel:
        stub = pb_grpc.CacheServiceStub(channel)
        listed = stub.ListCaches(pb.ListCachesRequest(view=pb.CACHE_VIEW_BASIC), timeout=600)
        one = stub.GetCache(pb.GetCacheRequest(name=largest), timeout=600)
    return {"list_bytes": listed.ByteSize(), "info_bytes": one.ByteSize()}


def _latencies(daemon: BenchDaemon, cc: CacheClient, largest: str, repeat: int) -> dict:
    listed = len(cc.list())
    return {
        "caches_listed": listed,
        "list_rpc_s": _median_s(cc.list, repeat),
        "info_rpc_s": _median_s(lambda: cc.info(largest), repeat),
        "ls_command_s": _command_s(daemon, "ls"),
        "info_command_s": _command_s(daemon, "info", largest),
        **_response_bytes(daemon, largest),
    }


def read_all(cc: CacheClient, names: Sequence[str], sums: dict[str, int], per: int) -> float:
    """Read every cache once over gRPC (the daemon opens each shard), checking each one's
    element count and sum; seconds taken."""
    start = time.perf_counter()
    for name in names:
        count = total = 0
        for batch in cc.numpy(name, batch_size=1024, direct=False):
            count += len(batch)
            total += int(np.sum(batch))
        info = cc.info(name)
        if count != info.num_elements or total != sums[name]:
            raise RuntimeError(
                f"cache {name!r}: read {count} elements summing to {total}, expected "
                f"{info.num_elements} summing to {sums[name]}"
            )
    return time.perf_counter() - start


def daemon_point(root: Path, caches: int, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    """One point: build, restart, measure, read every cache, measure again."""
    prefix = ("prlimit", f"--nofile={args.daemon_nofile}", "--") if args.daemon_nofile else ()
    directory = Path(tempfile.mkdtemp(prefix=f"p{caches}x{shards}-", dir=root))
    daemon = BenchDaemon(directory, "d", prefix=prefix)
    names = [f"c{i:05d}" for i in range(caches)]
    point: dict[str, Any] = {"caches": caches, "shards_per_cache": shards}
    point["shards"] = caches * shards
    try:
        daemon.start()
        log(f"{caches}x{shards}: writing {caches * shards:,} shards")
        start = time.perf_counter()
        with (
            CacheClient(daemon.target) as cc,
            concurrent.futures.ThreadPoolExecutor(args.writers) as pool,
        ):
            sums = dict(
                zip(
                    names,
                    pool.map(lambda n: build_cache(cc, n, shards, args.elements_per_shard), names),
                )
            )
        point["build_s"] = time.perf_counter() - start
        point["data_dir_bytes"] = _du(daemon.data_dir)
        daemon.stop()
        os.sync()
        start = time.perf_counter()
        daemon.start(timeout_s=args.start_timeout)
        point["start_s"] = time.perf_counter() - start
        log(f"{caches}x{shards}: healthy after {point['start_s']:.2f} s")
        with CacheClient(daemon.target) as cc:
            point["after_start"] = {
                **process_facts(daemon.pid),
                **_latencies(daemon, cc, names[0], args.repeat),
            }
            point["read_all_s"] = read_all(cc, names, sums, args.elements_per_shard)
            log(f"{caches}x{shards}: read every cache in {point['read_all_s']:.2f} s")
            point["after_reads"] = {
                **process_facts(daemon.pid),
                **_latencies(daemon, cc, names[0], args.repeat),
            }
    except Exception as exc:  # the point says why; the others still run
        point["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        point["log_tail"] = daemon.log_tail()
        log(f"{caches}x{shards}: failed: {point['error'][:300]}")
    finally:
        daemon.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return point


def _du(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def daemon_section(root: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    points = []
    for caches, shards in args.points:
        point = daemon_point(root, caches, shards, args)
        point["limits"] = system_limits()
        points.append(point)
        if "error" not in point:
            after = point["after_reads"]
            log(
                f"{caches}x{shards}: ls {after['list_rpc_s'] * 1e3:.1f} ms (rpc, "
                f"{after['list_bytes']:,} B), "
                f"{after['ls_command_s']:.2f} s (command); rss {after['vm_rss_kib'] / 1024:.0f} "
                f"MiB; fds {after['fds']}, maps {after['maps']}"
            )
    return points


# ---------------------------------------------------------------------- the epochs section
def source(kind: str, size: int) -> tuple[Any, int]:
    """A tf.data source of about size bytes of kind's elements (rows of a random pool with the
    index in front: incompressible, each distinct), and its element count."""
    import tensorflow as tf

    shape = ELEMENT_SHAPES[kind]
    row = int(np.prod(shape))
    n = max(1, size // row)
    pool_rows = max(2, (16 << 20) // row)
    pool = tf.constant(np.random.default_rng(0).integers(0, 256, (pool_rows, row), np.uint8))
    batch = max(1, (4 << 20) // row)

    def make(first: Any) -> Any:
        index = tf.range(first, tf.minimum(first + batch, n))
        rows = tf.gather(pool, index % pool_rows)
        head = tf.bitcast(tf.cast(index, tf.int64)[:, None], tf.uint8)[:, 0, :]
        rows = tf.concat([head, rows[:, 8:]], axis=1)
        return tf.reshape(rows, (-1, *shape))

    ds = (
        tf.data.Dataset.range(0, n, batch)
        .map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
    )
    return ds, n


def epoch_s(ds: Any, n: int) -> float:
    start = time.perf_counter()
    count = 0
    for batch in ds.batch(256).prefetch(2):
        count += int(batch.shape[0])
    elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"an epoch yielded {count} elements, expected {n}")
    return elapsed


def cat_s(files: Sequence[Path]) -> float:
    """Seconds to read files sequentially to /dev/null with cat."""
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _cold(can_drop: bool, measure: Callable[[], float]) -> float | None:
    if not can_drop:
        return None
    drop_page_cache()
    return measure()


def read_rows(
    ds: Any, n: int, files: Sequence[Path], can_drop: bool
) -> dict[str, float | int | None]:
    """A written strategy's cold and warm epochs of ds, and cat of its files cold and warm."""
    return {
        "file_bytes": sum(f.stat().st_size for f in files),
        "cold_s": _cold(can_drop, lambda: epoch_s(ds, n)),
        "warm_s": epoch_s(ds, n),
        "cat_cold_s": _cold(can_drop, lambda: cat_s(files)),
        "cat_warm_s": cat_s(files),
    }


def epoch_rows(
    work: Path, kind: str, size: int, can_drop: bool, strategies: Sequence[str]
) -> Iterator[dict[str, Any]]:
    """The rows of one size and element kind: each strategy's write, cold and warm epochs,
    and cat of its files cold and warm. A strategy's files are removed before the next one
    writes, so the disk needs room for one copy of the data, not three."""
    ds, n = source(kind, size)
    base = {"elements": kind, "size_bytes": size, "n": n}
    name = f"{kind}-{size}"
    daemon = BenchDaemon(work, "e", data_root=work)
    daemon.start()
    try:
        with CacheClient(daemon.target) as cc:

            def written(strategy: str) -> tuple[Any, Path, Callable[[], Any]]:
                """strategy's dataset over ds, where its files go, and how to remove them."""
                if strategy == "shardcache":
                    return (
                        cc.cache(ds, name),
                        daemon.data_dir / "caches" / name,
                        (lambda: cc.delete(name)),
                    )
                where = work / strategy
                where.mkdir()
                cached = (
                    ds.snapshot(str(where))
                    if strategy == "snapshot"
                    else ds.cache(str(where / "cache"))  # cache.index and cache.data-*
                )
                return cached, where, lambda: shutil.rmtree(where)

            for strategy in strategies:
                log(f"epochs {kind} {size:,} B: {strategy}")
                cached, where, remove = written(strategy)
                try:
                    row = {**base, "strategy": strategy, "write_s": epoch_s(cached, n)}
                    reader = cc.dataset(name) if strategy == "shardcache" else cached
                    yield {**row, **read_rows(reader, n, _files(where), can_drop)}
                finally:
                    remove()
    finally:
        daemon.stop()


def _row_line(row: dict[str, Any]) -> str:
    def took(key: str) -> str:
        return "-" if row.get(key) is None else f"{row[key]:.1f} s"

    return (
        f"{row['strategy']}: write {took('write_s')}, cold {took('cold_s')}, warm "
        f"{took('warm_s')}; cat cold {took('cat_cold_s')}, warm {took('cat_warm_s')}; peak "
        f"RssAnon {row['peak_rss_anon_kib'] / 1024:,.0f} MiB"
    )


def epochs_section(
    root: Path, args: argparse.Namespace, saved: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The epochs rows, each with this process's peak RssAnon over its strategy's write and
    reads (peak_rss_anon_kib); saved(section) after every row (a size past the memory may
    end the process)."""
    can_drop = os.geteuid() == 0
    note = "" if can_drop else "not root: cold epochs and cold cat skipped (drop_caches)"
    if note:
        log(note)
    section: dict[str, Any] = {"rows": [], "note": note}
    memory = RssSampler(interval_s=0.5).start()
    try:
        for size in args.sizes:
            for kind in args.elements:
                work = Path(tempfile.mkdtemp(prefix=f"epochs-{kind}-", dir=root))
                try:
                    memory.reset_window()
                    for row in epoch_rows(work, kind, size, can_drop, args.strategies):
                        row["peak_rss_anon_kib"] = memory.window_anon_kib
                        memory.reset_window()
                        section["rows"].append(row)
                        log(f"epochs {kind} {size:,} B: {_row_line(row)}")
                        saved(section)
                except Exception as exc:
                    error = {"elements": kind, "size_bytes": size, "error": f"{exc}"[:2000]}
                    section["rows"].append(error)
                    log(f"epochs {kind} {size:,} B: failed: {exc}")
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        memory.stop()
    return section


# ---------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__, repeat=5)
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=("daemon", "epochs"),
        default=["daemon", "epochs"],
        help="what to measure (default: both)",
    )
    parser.add_argument(
        "--points",
        type=parse_points,
        default=None,
        help=f"CACHESxSHARDS per cache, comma separated (default {DEFAULT_POINTS}; "
        f"--quick: {QUICK_POINTS})",
    )
    parser.add_argument(
        "--elements-per-shard", type=int, default=4, help="int64 elements per shard (default 4)"
    )
    parser.add_argument(
        "--writers", type=int, default=4, help="caches written at a time (default 4)"
    )
    parser.add_argument(
        "--daemon-nofile",
        type=int,
        default=0,
        metavar="N",
        help="start the daemon under prlimit --nofile=N (default: the inherited limit)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="seconds a restarted daemon may take to become healthy (default 600)",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help=f"epochs: cache sizes, comma separated (default {DEFAULT_SIZES}; --quick: "
        f"{QUICK_SIZES}); 0.25x to 2x RAM on a 24 GiB machine: 6GiB,12GiB,24GiB,48GiB",
    )
    parser.add_argument(
        "--elements",
        type=parse_elements,
        default=list(ELEMENT_SHAPES),
        help=f"epochs: element kinds, comma separated (default {','.join(ELEMENT_SHAPES)})",
    )
    parser.add_argument(
        "--strategies",
        type=parse_strategies,
        default=list(STRATEGIES),
        help=f"epochs: what writes and reads the data, comma separated (default "
        f"{','.join(STRATEGIES)}; tf.data's snapshot writes 1 KiB elements at ~25 MB/s here)",
    )
    parser.add_argument("--quick", action="store_true", help="small points and sizes")
    parser.add_argument(
        "--tmp-dir", type=Path, default=None, help="where the data dirs go (default $TMPDIR)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="raw results (default bench/results/scale.json; --quick: bench/results/"
        "scale-quick.json)",
    )
    args = parser.parse_args(argv)
    if args.points is None:
        args.points = parse_points(QUICK_POINTS if args.quick else DEFAULT_POINTS)
    if args.sizes is None:
        args.sizes = parse_sizes(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.quick:
        args.repeat = min(args.repeat, 3)
    if args.out is None:
        args.out = BENCH_DIR / "results" / ("scale-quick.json" if args.quick else "scale.json")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "command": reproducing_command(),
        "machine": machine_facts(args.tmp_dir),
        "limits": system_limits(),
    }
    root = Path(tempfile.mkdtemp(prefix="scale-", dir=args.tmp_dir))
    try:
        if "daemon" in args.sections:
            results["daemon"] = daemon_section(root, args)
            write_json(args.out, results)
        if "epochs" in args.sections:

            def saved(section: dict[str, Any]) -> None:
                write_json(args.out, {**results, "epochs": section})

            results["epochs"] = epochs_section(root, args, saved)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        write_json(args.out, results)


if __name__ == "__main__":
    main()
