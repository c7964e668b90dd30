"""Materialization throughput: 1 vs N daemon workers on a CPU-bound pipeline, in one run.

Run from the repository root::

    .venv/bin/python bench/materialize.py [--shards 4] [--elements-per-shard 1000]
                                          [--workers 1 2] [--repeat 1]

The pipeline (``cpu_bound`` below, run by the daemon as the entry point
``materialize:cpu_bound`` with ``--pythonpath bench --materialize-allow
materialize:cpu_bound``) derives each element from its index with stateless random
ops and a few 128x128 matmuls: about 2 ms of one core per element, 64 KiB of float32
out. TensorFlow is held to one thread per process (intra- and inter-op) so that one
worker uses one core and the speed-up measures the daemon's worker processes, not TF's
own threading.

First the pipeline's own speed is measured in this process (one shard
iterated, nothing stored); then one daemon materializes the same shards with
each worker count in turn. Prints a markdown table for docs/benchmarks.md on
stdout, progress on stderr. Wall times include starting the workers (a
spawned process imports TensorFlow: seconds).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import BENCH_DIR, BenchDaemon, loadavg, markdown_table

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ELEMENTS_ENV = "SC_BENCH_ELEMENTS_PER_SHARD"


def _one_thread() -> None:
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # already initialized: keep going with what is set
        pass


def cpu_bound(shard_index: int, num_shards: int):
    """~2 ms of CPU per element, 64 KiB (128x128 float32) per element."""
    import tensorflow as tf

    _one_thread()
    n = int(os.environ.get(ELEMENTS_ENV, "1000"))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.autotune.enabled = False

    def element(i: tf.Tensor) -> tf.Tensor:
        seed = tf.stack([i, tf.constant(7, tf.int64)])
        x = tf.random.stateless_normal([128, 128], seed=seed)
        for _ in range(30):
            x = tf.tanh(tf.matmul(x, x) / 128.0)
        noise = tf.random.stateless_uniform([128, 128], seed=seed + 1)
        return x + noise  # as incompressible as real features: zstd gets little out of it

    first = shard_index * n
    return tf.data.Dataset.range(first, first + n).map(element).with_options(options)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _pipeline_speed(elements: int) -> float:
    """Elements/s of one shard of the pipeline iterated here, one thread, nothing stored."""
    ds = cpu_bound(0, 1)
    it = iter(ds)
    next(it)  # warm up: trace the map function
    start = time.perf_counter()
    count = 1 + sum(1 for _ in it)
    return (count - 1) / (time.perf_counter() - start) if count > 1 else float("nan")


def _worker_cpu(daemon_pid: int, op: Any) -> float:
    """CPU seconds the daemon's worker processes used until op is done (sampled)."""
    import psutil

    used: dict[int, float] = {}
    while not op.progress().done:
        for child in psutil.Process(daemon_pid).children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    t = child.cpu_times()
                    used[child.pid] = t.user + t.system
            except psutil.Error:
                pass
        time.sleep(0.2)  # a sampling period, not synchronisation
    return sum(used.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--elements-per-shard", type=int, default=1000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1, help="runs per worker count (best)")
    args = parser.parse_args()
    os.environ[ELEMENTS_ENV] = str(args.elements_per_shard)  # the daemon's workers inherit it
    from client import CacheClient

    load = loadavg()
    _one_thread()
    _log("measuring the pipeline's own speed (one shard, this process)...")
    own = _pipeline_speed(args.elements_per_shard)
    element_bytes = 128 * 128 * 4
    tmp = Path(tempfile.mkdtemp(prefix="sc-bench-mat-"))
    daemon = BenchDaemon.in_dir(tmp, "daemon", ("--pythonpath", str(BENCH_DIR),
                                                "--materialize-allow", "materialize:cpu_bound",
                                                "--log-level", "warning"))
    try:
        daemon.start()
        with CacheClient(daemon.address) as cc:
            best: dict[int, tuple[float, Any, float]] = {}
            for rep in range(args.repeat):  # interleaved, so drifting load hits all alike
                for workers in args.workers:
                    name = f"bench-w{workers}-{rep}"
                    _log(f"materializing {args.shards} shards with {workers} worker(s)...")
                    start = time.perf_counter()
                    op = cc.materialize("materialize:cpu_bound", name=name,
                                        num_shards=args.shards, workers=workers, wait=False)
                    cpu = _worker_cpu(daemon.pid, op)
                    progress = op.wait()
                    wall = time.perf_counter() - start
                    cc.delete(name)
                    if workers not in best or wall < best[workers][0]:
                        best[workers] = (wall, progress, cpu / wall)
            rows = [(w, *best[w]) for w in args.workers]
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    total = args.shards * args.elements_per_shard
    base = rows[0][1]
    print(f"`.venv/bin/python bench/materialize.py --shards {args.shards} "
          f"--elements-per-shard {args.elements_per_shard} --workers "
          f"{' '.join(map(str, args.workers))} --repeat {args.repeat}` on "
          f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
          f"load average before the run {load} (1/5/15 min; the machine is shared).\n")
    print(f"Pipeline's own speed (one thread, nothing stored): {own:,.0f} elements/s, "
          f"{own * element_bytes / 2**20:,.1f} MiB/s.\n")
    print(markdown_table(
        ["workers", "wall s", "elements/s", "raw MiB/s", "stored MiB/s", "vs 1 worker",
         "vs pipeline alone", "cores the workers got"],
        ([workers, f"{wall:.1f}", f"{total / wall:,.0f}",
          f"{progress.raw_bytes / wall / 2**20:,.1f}",
          f"{progress.stored_bytes / wall / 2**20:,.1f}", f"{base / wall:.2f}x",
          f"{total / wall / own:.2f}x", f"{cores:.2f}"]
         for workers, wall, progress, cores in rows)))


if __name__ == "__main__":
    main()
