"""One point, a (workload, size, strategy), in a process of its own; the strategies.

``run.py`` and ``write_path.py`` start it through :func:`run_point`; it prints one ``RESULT``
line. Each strategy turns the source into two epochs, batching after the cache op:

- ``none``: the bare pipeline, twice;
- ``memory``, ``file``: ``ds.cache()``, ``ds.cache(filename)``: fill, then read;
- ``save_load``: ``Dataset.save`` (timed as epoch 1), then iterate ``Dataset.load``;
- ``shardcache_direct``, ``shardcache_plane``, ``shardcache``: ``cc.cache`` write-through,
  then read from the shard files (a client on the daemon's unix socket, ``direct``), over the
  data plane (a client on its TCP address, ``--target``: remote to the daemon) or over gRPC
  (on the unix socket, ``direct=False``); ``--client-option`` passes keywords to ``cc.cache()``.

``--read-only`` reads an existing cache (``--cache-name``) for one epoch of ``cc.dataset()``
instead: over gRPC (``shardcache``), the shard files (``shardcache_direct``) or the daemon's
data plane (``shardcache_plane``, with ``--target`` its TCP address), and records the
epoch's peak ``RssAnon`` and the ``RssAnon`` left at its end (the memory section's growth
table).

Memory is the peak ``RssAnon``: memory-mapped files (LMDB, the page cache) do not count.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import BENCH_DIR, REPO_ROOT, arguments, print_result, run_child
from probes import RssSampler, cpu_seconds, directory_bytes, drop_page_cache, kib_to_mb
from timing import EpochResult, timed_iteration

if TYPE_CHECKING:
    from collections.abc import Sequence

    import tensorflow as tf
    from harness import BenchDaemon

STRATEGIES = (
    "none",
    "memory",
    "file",
    "save_load",
    "shardcache_plane",
    "shardcache_direct",
    "shardcache",
)
WARMUP_BATCHES = 2  # of zero elements before epoch 1: every process starts TF's pools alike
Epoch = Callable[[], EpochResult]


def plan(strategy: str, src: tf.data.Dataset, args: argparse.Namespace) -> tuple[Epoch, Epoch, Any]:
    """The two epochs of ``strategy`` over ``src``, and the client to close after them."""
    import tensorflow as tf

    tmp, batch = Path(args.tmp_dir), args.batch_size
    if strategy == "save_load":

        def save() -> EpochResult:
            start = time.perf_counter()
            src.save(str(tmp / "saved"))
            return EpochResult(time.perf_counter() - start, args.n, None)

        return (
            save,
            lambda: timed_iteration(tf.data.Dataset.load(str(tmp / "saved")).batch(batch)),
            None,
        )
    client = None
    if args.read_only:
        from client import CacheClient

        client = CacheClient(args.target or "unix://" + args.socket)
        ds = client.dataset(
            args.cache_name, direct=strategy == "shardcache_direct", **dict(args.client_option)
        ).batch(batch)
        return (lambda: timed_iteration(ds)), (lambda: timed_iteration(ds)), client
    if strategy == "memory":
        ds = src.cache()
    elif strategy == "file":
        ds = src.cache(str(tmp / "cache"))
    elif strategy.startswith("shardcache"):
        from client import CacheClient

        remote = strategy == "shardcache_plane"
        client = CacheClient(args.target if remote else "unix://" + args.socket)
        options = {"direct": strategy == "shardcache_direct", **dict(args.client_option)}
        ds = client.cache(src, name=args.cache_name, **options)
    else:
        ds = src
    ds = ds.batch(batch)  # one dataset object twice: the cache lives in it
    return (lambda: timed_iteration(ds)), (lambda: timed_iteration(ds)), client


def run_epoch(
    epoch: Epoch, sampler: RssSampler, expected: int, args: argparse.Namespace, cold: bool
) -> dict[str, Any]:
    """One epoch, after a ``sync``: its time, checks, peak RssAnon, CPU time (daemon's too)."""
    os.sync()  # the previous epoch's writes are not this one's to pay
    if cold:
        drop_page_cache()
    sampler.reset_window()
    before = resource.getrusage(resource.RUSAGE_SELF)
    daemon_before = cpu_seconds(args.daemon_pid) if args.daemon_pid else 0.0
    result = epoch()
    after = resource.getrusage(resource.RUSAGE_SELF)
    sampler.sample()
    record = asdict(result)
    record["label_sum_ok"] = None if result.label_sum is None else result.label_sum == expected
    record["elements_ok"] = result.elements == args.n
    record["peak_rss_anon_mb"] = kib_to_mb(sampler.window_anon_kib)
    record["end_rss_anon_mb"] = kib_to_mb(sampler.sample())
    record["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if args.daemon_pid:
        record["daemon_cpu_seconds"] = cpu_seconds(args.daemon_pid) - daemon_before
    return record


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, run the strategy's epochs; the result record."""
    sampler = RssSampler().start()
    result: dict[str, Any] = {
        "workload": args.workload,
        "n": args.n,
        "strategy": args.strategy,
        "batch_size": args.batch_size,
        "status": "ok",
        "error": None,
        "epochs": [],
    }
    try:
        import tensorflow as tf
        from workloads import WORKLOADS, expected_label_sum, make_source, make_warmup

        result["tf_version"] = tf.__version__
        result["baseline_rss_anon_mb"] = kib_to_mb(sampler.sample())
        workload = WORKLOADS[args.workload]
        warmup = make_warmup(workload, min(WARMUP_BATCHES * args.batch_size, args.n))
        result["warmup_seconds"] = timed_iteration(warmup.batch(args.batch_size)).seconds
        result["warm_rss_anon_mb"] = kib_to_mb(sampler.sample())
        src = make_source(workload, args.n)
        if args.pipeline_threads:  # the source's map on a pool of its own, one op thread each
            options = tf.data.Options()
            options.threading.private_threadpool_size = args.pipeline_threads
            options.threading.max_intra_op_parallelism = 1
            src = src.with_options(options)
        expected = expected_label_sum(workload, args.n)
        *epochs, client = plan(args.strategy, src, args)
        for index, epoch in enumerate(epochs[: args.epochs]):
            result["epochs"].append(
                run_epoch(epoch, sampler, expected, args, args.cold and index > 0)
            )
        if client is not None:
            client.close()
        result["disk_bytes"] = directory_bytes(Path(args.tmp_dir))
    except Exception as exc:
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    finally:
        sampler.stop()
    result["peak_rss_anon_mb"] = kib_to_mb(sampler.peak_anon_kib)
    return result


def run_point(
    workload: str,
    n: int,
    strategy: str,
    *,
    scratch: Path,
    daemon: BenchDaemon | None = None,
    cache_name: str | None = None,
    batch_size: int = 256,
    extra_args: Sequence[str] = (),
    prefix: Sequence[str] = (),
    timeout_s: float | None = None,
    keep_cache: bool = False,
) -> dict[str, Any]:
    """One measurement process (behind ``prefix``): its record, ``status`` ``error`` if it
    failed. With a daemon, its RssAnon is sampled meanwhile, its disk's growth recorded, and a
    measured cache deleted after unless keep_cache (one on the disk at a time); the client is
    the daemon's checkout's. ``shardcache_plane`` reads from the daemon's ``tcp_target``.
    """
    tmp_dir = Path(tempfile.mkdtemp(prefix=f"{workload}-{n}-{strategy}-", dir=scratch))
    cmd = [
        *prefix,
        sys.executable,
        str(BENCH_DIR / "measure.py"),
        "--workload",
        workload,
        "--n",
        str(n),
        "--strategy",
        strategy,
        "--tmp-dir",
        str(tmp_dir),
        "--batch-size",
        str(batch_size),
        *extra_args,
    ]
    base: dict[str, Any] = {"workload": workload, "n": n, "strategy": strategy, "epochs": []}
    if daemon is not None:
        base["cache_name"] = cache_name = cache_name or f"{workload}-{n}-{strategy}"
        cmd += [
            "--socket",
            str(daemon.socket_path),
            "--cache-name",
            cache_name,
            "--daemon-pid",
            str(daemon.pid),
        ]
        if strategy == "shardcache_plane":
            if daemon.tcp_target is None:
                raise ValueError("shardcache_plane reads remotely: start the daemon with tcp=True")
            cmd += ["--target", daemon.tcp_target]
    sampler = RssSampler(daemon.pid).start() if daemon else None
    disk_before = directory_bytes(daemon.data_dir) if daemon else 0
    start = time.monotonic()
    try:
        record = base | run_child(cmd, daemon.root if daemon else REPO_ROOT, timeout_s)
    except RuntimeError as exc:
        return base | {"status": "error", "error": str(exc)}
    finally:
        if sampler is not None:
            sampler.stop()
        shutil.rmtree(tmp_dir, ignore_errors=True)
    record["process_seconds"] = time.monotonic() - start
    if daemon is not None and sampler is not None:
        record["daemon_peak_rss_anon_mb"] = kib_to_mb(sampler.peak_anon_kib)
        record["daemon_disk_bytes"] = directory_bytes(daemon.data_dir) - disk_before
    if daemon is not None and record.get("status") == "ok" and not keep_cache:
        try:
            daemon.delete_cache(base["cache_name"])
        except Exception as exc:  # a cache left behind costs disk space, not correctness
            print(f"(could not delete cache {base['cache_name']}: {exc})", file=sys.stderr)
    return record


def parse_client_option(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as a keyword argument: true/false, an int, a float, else a string."""
    key, sep, text = item.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"bad client option {item!r}: expected KEY=VALUE, e.g. parallel_shards=4"
        )
    if text.lower() in ("true", "false"):
        return key, text.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(text)
        except ValueError:
            continue
    return key, text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--n", type=int, required=True, help="number of elements")
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument("--tmp-dir", required=True, help="scratch directory for cache files")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--epochs",
        type=int,
        choices=(1, 2),
        default=2,
        help="1: the filling epoch only (write_path.py)",
    )
    parser.add_argument("--socket", help="the daemon's unix socket")
    parser.add_argument("--target", help="the daemon's TCP address (host:port), read remotely")
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="read the existing cache --cache-name for one epoch",
    )
    parser.add_argument(
        "--daemon-pid",
        type=int,
        default=0,
        help="the daemon's pid: its CPU seconds per epoch are recorded",
    )
    parser.add_argument("--cache-name")
    parser.add_argument(
        "--client-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=parse_client_option,
        help="a keyword of cc.cache()",
    )
    parser.add_argument(
        "--pipeline-threads",
        type=int,
        default=0,
        metavar="N",
        help="run the source's map on a private pool of N threads (0: all)",
    )
    parser.add_argument(
        "--cold", action="store_true", help="drop the page cache before epoch 2 (root)"
    )
    args = parser.parse_args(argv)
    args.cache_name = args.cache_name or f"{args.workload}-{args.n}"
    if args.read_only:
        args.epochs = 1
    if args.strategy == "shardcache_plane" and not args.target:
        parser.error("shardcache_plane reads remotely: pass --target, the daemon's TCP address")
    return args


if __name__ == "__main__":
    print_result(measure(parse_args()))
