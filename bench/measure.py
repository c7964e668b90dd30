"""One measurement, a (workload, size, strategy) in a process of its own, and the strategies.

``run.py`` and ``write_path.py`` start this script once per point (:func:`run_point`), so
that memory is measured in isolation::

    python bench/measure.py --workload image --n 1000 --strategy memory --tmp-dir DIR

It prints one ``RESULT`` line of JSON on stdout (``harness.print_result``); everything else,
TensorFlow's log included, is noise the parent ignores. Memory is the peak of ``RssAnon``
sampled every 20 ms: memory-mapped files (LMDB, the page cache) do not count.

Every strategy turns the uncached source into two epochs, batching after the cache op:

=====================  ================================================================
strategy               epoch 1 / epoch 2
=====================  ================================================================
``none``               recompute the source / recompute it
``memory``             ``ds.cache()`` fill / read from memory
``file``               ``ds.cache(filename)`` write / read the cache files
``save_load``          ``Dataset.save`` (timed as epoch 1) / iterate ``Dataset.load``
``save_load_gzip``     the same with ``compression="GZIP"`` (not run unless named)
``shardcache``         ``CacheClient.cache`` write-through / read over gRPC (``direct=False``)
``shardcache_direct``  the same, epoch 2 reading the shard files under a read lease
``shardcache_read``    ``cc.dataset`` of an existing cache, twice (not run unless named)
=====================  ================================================================

``--client-option KEY=VALUE`` passes keyword arguments to ``cc.cache()``/``cc.dataset()``.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import (
    BENCH_DIR,
    REPO_ROOT,
    EpochResult,
    RssSampler,
    cpu_seconds,
    directory_bytes,
    drop_page_cache,
    kib_to_mb,
    print_result,
    run_child,
    timed_iteration,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import tensorflow as tf
    from harness import BenchDaemon

STRATEGIES: tuple[str, ...] = ("none", "memory", "file", "save_load", "shardcache",
                               "shardcache_direct")
EXTRA_STRATEGIES: tuple[str, ...] = ("save_load_gzip", "shardcache_read")
WARMUP_BATCHES = 2


class StrategyUnavailableError(Exception):
    """The strategy cannot run in this environment (no daemon, ``client`` not importable)."""


@dataclass
class Plan:
    """Two epochs ready to run, plus objects that must stay alive until both have run."""

    epochs: tuple[Callable[[], EpochResult], Callable[[], EpochResult]]
    keep_alive: list[object] = field(default_factory=list)


def _twice(ds: tf.data.Dataset, *keep: object) -> Plan:
    """Iterate one dataset object twice (a cache lives in that object)."""
    return Plan((lambda: timed_iteration(ds), lambda: timed_iteration(ds)), list(keep))


def _client(args: argparse.Namespace) -> Any:
    """A CacheClient on the runner's daemon, or StrategyUnavailableError saying why not."""
    try:
        from client import CacheClient
    except Exception as exc:  # any import-time failure means "not available here"
        raise StrategyUnavailableError(f"import client failed: {type(exc).__name__}: {exc}"
                                       ) from exc
    if args.socket is None:
        raise StrategyUnavailableError("no cacheserver daemon socket was provided")
    return CacheClient("unix://" + args.socket)


def plan(strategy: str, src: tf.data.Dataset, args: argparse.Namespace) -> Plan:
    """The two epochs of ``strategy`` over ``src``, batched by ``args.batch_size``."""
    import tensorflow as tf

    tmp, batch = Path(args.tmp_dir), args.batch_size
    if strategy == "none":
        return _twice(src.batch(batch))
    if strategy == "memory":
        return _twice(src.cache().batch(batch))
    if strategy == "file":
        return _twice(src.cache(str(tmp / "cache")).batch(batch))
    if strategy.startswith("save_load"):
        compression = "GZIP" if strategy == "save_load_gzip" else None

        def save() -> EpochResult:
            start = time.perf_counter()
            src.save(str(tmp / "saved"), compression=compression)
            return EpochResult(time.perf_counter() - start, args.n, None)

        def load() -> EpochResult:
            return timed_iteration(tf.data.Dataset.load(str(tmp / "saved"),
                                                        compression=compression).batch(batch))

        return Plan((save, load))
    cc = _client(args)
    options = {"direct": strategy == "shardcache_direct", **dict(args.client_option)}
    if strategy == "shardcache_read":  # the cache was built beforehand; no source needed
        return _twice(cc.dataset(args.cache_name, **options).batch(batch), cc)
    return _twice(cc.cache(src, name=args.cache_name, **options).batch(batch), cc)


def _run_epoch(epoch: Callable[[], EpochResult], sampler: RssSampler, expected: int, n: int,
               daemon_pid: int, cold: bool) -> dict[str, Any]:
    """Run one epoch and describe it: time, checks, peak RssAnon, CPU time, page faults."""
    os.sync()  # flush the previous epoch's writes so that this epoch does not pay for them
    if cold:
        drop_page_cache()
    sampler.reset_window()
    before = resource.getrusage(resource.RUSAGE_SELF)
    daemon_before = cpu_seconds(daemon_pid) if daemon_pid else 0.0
    result = epoch()
    after = resource.getrusage(resource.RUSAGE_SELF)
    sampler.sample()
    record = asdict(result)
    record["label_sum_ok"] = None if result.label_sum is None else result.label_sum == expected
    record["elements_ok"] = result.elements == n
    record["peak_rss_anon_mb"] = kib_to_mb(sampler.window_anon_kib)
    record["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    record["minor_faults"] = after.ru_minflt - before.ru_minflt
    if daemon_pid:
        record["daemon_cpu_seconds"] = cpu_seconds(daemon_pid) - daemon_before
    return record


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, run the epochs of one strategy and return the result record."""
    sampler = RssSampler().start()
    result: dict[str, Any] = {"workload": args.workload, "n": args.n, "strategy": args.strategy,
                              "batch_size": args.batch_size, "status": "ok", "error": None,
                              "epochs": []}
    try:
        import tensorflow as tf
        from workloads import WORKLOADS, expected_label_sum, make_source, make_warmup

        result["tf_version"] = tf.__version__
        result["baseline_rss_anon_mb"] = kib_to_mb(sampler.sample())
        workload = WORKLOADS[args.workload]
        warmup_elements = min(args.warmup_batches * args.batch_size, args.n)
        if warmup_elements > 0:
            warmup = make_warmup(workload, warmup_elements).batch(args.batch_size)
            result["warmup_seconds"] = timed_iteration(warmup).seconds
        result["warm_rss_anon_mb"] = kib_to_mb(sampler.sample())
        src = make_source(workload, args.n)
        if args.pipeline_threads:  # the source's map on a pool of its own, one op thread each
            options = tf.data.Options()
            options.threading.private_threadpool_size = args.pipeline_threads
            options.threading.max_intra_op_parallelism = 1
            src = src.with_options(options)
        expected = expected_label_sum(workload, args.n)
        try:
            epochs = plan(args.strategy, src, args)
            for index, epoch in enumerate(epochs.epochs[:args.epochs]):
                result["epochs"].append(_run_epoch(epoch, sampler, expected, args.n,
                                                   args.daemon_pid, args.cold and index > 0))
            for obj in epochs.keep_alive:
                close = getattr(obj, "close", None)
                if callable(close):
                    close()
        except StrategyUnavailableError as exc:
            result["status"] = "unavailable"
            result["error"] = str(exc)
        result["disk_bytes"] = directory_bytes(Path(args.tmp_dir))
    except Exception as exc:
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    finally:
        sampler.stop()
    result["peak_rss_anon_mb"] = kib_to_mb(sampler.peak_anon_kib)
    result["peak_rss_file_mb"] = kib_to_mb(sampler.peak_file_kib)
    return result


def run_point(workload: str, n: int, strategy: str, *, scratch: Path,
              daemon: BenchDaemon | None = None, cache_name: str | None = None,
              batch_size: int = 256, warmup_batches: int = WARMUP_BATCHES,
              extra_args: Sequence[str] = (), prefix: Sequence[str] = (),
              root: Path | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    """Run one measurement process (behind ``prefix``) and return its record.

    With a daemon, its RssAnon is sampled meanwhile and its data dir's growth recorded;
    ``root`` imports the client from another checkout (default: the daemon's, else this one).
    A failed process becomes a record with ``status`` ``error``.
    """
    tmp_dir = Path(tempfile.mkdtemp(prefix=f"{workload}-{n}-{strategy}-", dir=scratch))
    cmd = [*prefix, sys.executable, str(BENCH_DIR / "measure.py"), "--workload", workload,
           "--n", str(n), "--strategy", strategy, "--tmp-dir", str(tmp_dir),
           "--batch-size", str(batch_size), "--warmup-batches", str(warmup_batches),
           *extra_args]
    base: dict[str, Any] = {"workload": workload, "n": n, "strategy": strategy, "epochs": []}
    if daemon is not None:
        base["cache_name"] = cache_name = cache_name or f"{workload}-{n}-{strategy}"
        cmd += ["--socket", str(daemon.socket_path), "--cache-name", cache_name,
                "--daemon-pid", str(daemon.pid)]
    sampler = RssSampler(daemon.pid).start() if daemon else None
    disk_before = directory_bytes(daemon.data_dir) if daemon else 0
    start = time.monotonic()
    try:
        record = base | run_child(cmd, root or (daemon.root if daemon else REPO_ROOT),
                                  timeout_s)
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
    return record


def parse_client_option(item: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE`` into a keyword argument: true/false, an int, a float, else a string."""
    key, sep, text = item.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"bad client option {item!r}: expected KEY=VALUE, e.g. parallel_shards=4")
    if text.lower() in ("true", "false"):
        return key, text.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(text)
        except ValueError:
            continue
    return key, text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line of one measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--n", type=int, required=True, help="number of elements")
    parser.add_argument("--strategy", required=True, choices=STRATEGIES + EXTRA_STRATEGIES)
    parser.add_argument("--tmp-dir", required=True, help="scratch directory for cache files")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, choices=(1, 2), default=2,
                        help="1: the filling epoch only (write_path.py)")
    parser.add_argument("--socket", default=None, help="cacheserver unix socket path")
    parser.add_argument("--daemon-pid", type=int, default=0,
                        help="the daemon's pid: its CPU seconds per epoch are recorded")
    parser.add_argument("--cache-name", default=None, help="shardcache cache name")
    parser.add_argument("--client-option", action="append", default=[], metavar="KEY=VALUE",
                        type=parse_client_option,
                        help="keyword argument for cc.cache()/cc.dataset() (shardcache "
                        "strategies), e.g. parallel_shards=4; VALUE true/false/int/float/str")
    parser.add_argument("--pipeline-threads", type=int, default=0, metavar="N",
                        help="run the source's map on a private pool of N threads (0: all)")
    parser.add_argument("--cold", action="store_true",
                        help="drop the page cache before epoch 2 (needs root)")
    parser.add_argument("--warmup-batches", type=int, default=WARMUP_BATCHES,
                        help="batches of zero elements (at most --n) iterated before epoch 1")
    args = parser.parse_args(argv)
    args.cache_name = args.cache_name or f"{args.workload}-{args.n}"
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: measure, then print the ``RESULT`` line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print_result(measure(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
