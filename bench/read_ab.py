"""Warm epoch-2 reads, interleaved in one process: shardcache's read paths beside tf.data's caches.

Run from the repository root::

    .venv/bin/python bench/read_ab.py [--workload flat-602k] [--elements 600] [--batch 64]
        [--repeat 7] [--parallel 0,1,2,4] [--out read_ab.json]
    taskset -c 0 .venv/bin/python bench/read_ab.py ...      # the same on one core

One daemon, one cache written once through ``cc.cache``, tf.data's ``cache(filename)``,
``snapshot`` (uncompressed: its default compression refuses 602 KB elements) and
``Dataset.save`` files of the same source, then every strategy read once to warm up and
``--repeat`` times in turn (A, B, C, A, B, C, ...), each epoch timed to its last batch of
``--batch``. Each strategy's best epoch is reported with its median, and the ratios of the
best epochs to ``cache(filename)``, ``snapshot`` and ``Dataset.load``: on the shared 2-core
machine these figures come from, epochs of every strategy (tf.data's own caches too) take
either their own time or that plus a whole multiple of ~0.64 s, so a median says more about
the machine than the code; the interleaving exposes every strategy to the same noise.

Strategies: ``direct``/``grpc`` are ``cc.dataset(name, direct=...)`` reading by chunks in
tf.data's threads (client/read/chunks.py), one per ``--parallel`` value (0: AUTOTUNE, else
``parallel_shards``, the chunks in flight); ``direct-stream``/``grpc-stream`` are the same
reads through the stream reader (``SHARDCACHE_READ_CHUNKS=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from daemons import BenchDaemon
from workloads import WORKLOADS, make_source

from client import CacheClient
from client.tf.reads import CHUNKS_ENV

BASELINES = ("cache(filename)", "snapshot", "Dataset.load")


def epoch_rate(ds: tf.data.Dataset, n: int) -> float:
    start = time.perf_counter()
    count = 0
    for batch in ds:
        count += int(tf.shape(tf.nest.flatten(batch)[0])[0])
    elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"an epoch yielded {count} elements, not {n}")
    return n / elapsed


def strategies(cc: CacheClient, src: tf.data.Dataset, tmp: Path, batch: int,
               parallel: list[int]) -> dict[str, tf.data.Dataset]:
    out: dict[str, tf.data.Dataset] = {}
    cached = src.cache(str(tmp / "file"))
    for _ in cached:
        pass
    out["cache(filename)"] = cached.batch(batch)
    snap = src.snapshot(str(tmp / "snapshot"), compression=None)
    for _ in snap:
        pass
    out["snapshot"] = src.snapshot(str(tmp / "snapshot"), compression=None).batch(batch)
    src.save(str(tmp / "saved"))
    out["Dataset.load"] = tf.data.Dataset.load(str(tmp / "saved")).batch(batch)
    for _ in cc.cache(src, name="ab"):
        pass
    for p in parallel:
        tag = "auto" if p == 0 else str(p)
        for mode, direct in (("direct", True), ("grpc", False)):
            out[f"{mode} p={tag}"] = cc.dataset("ab", direct=direct,
                                                parallel_shards=p).batch(batch)
    os.environ[CHUNKS_ENV] = "0"
    try:
        out["direct-stream"] = cc.dataset("ab", direct=True).batch(batch)
        out["grpc-stream"] = cc.dataset("ab", direct=False).batch(batch)
    finally:
        del os.environ[CHUNKS_ENV]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="flat-602k", choices=sorted(WORKLOADS))
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--parallel", default="0",
                        help="comma-separated chunks in flight (0: AUTOTUNE)")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    parallel = [int(p) for p in args.parallel.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="shardcache-read-ab-"))
    daemon = BenchDaemon(tmp / "data", tmp / "d.sock", tmp / "d.log")
    daemon.start()
    try:
        with CacheClient(daemon.address) as cc:
            src = make_source(WORKLOADS[args.workload], args.elements)
            plans = strategies(cc, src, tmp, args.batch, parallel)
            rates: dict[str, list[float]] = {name: [] for name in plans}
            for ds in plans.values():  # warm-up
                epoch_rate(ds, args.elements)
            for i in range(args.repeat):
                for name, ds in plans.items():
                    rates[name].append(epoch_rate(ds, args.elements))
                print(f"pass {i + 1}/{args.repeat} done", file=sys.stderr)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {name: statistics.median(r) for name, r in rates.items()}
    best = {name: max(r) for name, r in rates.items()}
    cores = len(os.sched_getaffinity(0))
    print(f"{args.workload}, {args.elements} elements, batch {args.batch}, {cores} core(s), "
          f"{args.repeat} interleaved epochs each; ratios of the best epochs\n")
    print("| strategy | best elements/s | median | " + " | ".join(
        f"vs `{b}`" for b in BASELINES) + " |")
    print("|---|---|---|" + "---|" * len(BASELINES))
    for name, rate in best.items():
        ratios = " | ".join(f"{rate / best[b]:.2f}x" for b in BASELINES)
        print(f"| {name} | {rate:,.0f} | {medians[name]:,.0f} | {ratios} |")
    if args.out:
        result: dict[str, Any] = {"workload": args.workload, "elements": args.elements,
                                  "batch": args.batch, "cores": cores, "rates": rates}
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
