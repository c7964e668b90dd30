"""Reproduces docs/benchmarks.md, "A fleet on one machine" (and docs/fleet.md, "Speed").

A fleet on one machine (root): aggregate warm reads against the sum of capped links.

    .venv/bin/python bench/fleet.py --repeat 3

Each member is a daemon in a network namespace of its own, its link capped at ``--mbit``
both ways (``tests/fleet.py``), all over one moto store. A cache of ``--mb`` MB of 16 KiB
elements in ``--shards`` shards is written and published once; each fleet size reads one
untimed epoch (members pull what they own), then ``--repeat`` timed ones, each member's
shards over its data plane (``SHARDCACHE_DATA_PLANE=off``: over gRPC), with
``parallel_shards`` ``--per-member`` times the members. Per size: best and median MB/s, their
ratio to the links' sum, and the busiest member's bytes against the mean.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import BENCH_DIR, BenchDaemon, arguments, write_json
from timing import timed_iteration

from client import CacheClient
from tests.fleet import NetnsFleet, can_make_netns, metric
from tests.s3 import MotoServer
from tests.sharded import write_sharded

ELEMENT_FLOATS = 4096  # 16 KiB
SHARDS = 1024


def source(mb: int):
    import tensorflow as tf

    n = mb * (1 << 20) // (ELEMENT_FLOATS * 4)
    data = np.random.default_rng(0).standard_normal((n, ELEMENT_FLOATS)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(data), n


def read_bytes(fleet: NetnsFleet) -> list[float]:
    return [metric(d, "shardcache_read_bytes_total") for d in fleet.members]


def epoch(cc: CacheClient, name: str, parallel: int, n: int) -> float:
    """Seconds from the dataset's creation to its last batch (``timed_iteration``)."""
    start = time.perf_counter()
    # direct=False: the members share this machine's filesystem, so reads would skip the links
    ds = cc.dataset(name, parallel_shards=parallel, direct=False).batch(64)
    made = time.perf_counter() - start
    result = timed_iteration(ds)
    assert result.elements == n, (result.elements, n)
    return made + result.seconds


def main() -> None:
    parser = arguments(__doc__, out=True, repeat=3)
    parser.add_argument("--members", default="1,2,4,8", help="fleet sizes, comma-separated")
    parser.add_argument(
        "--mbit", type=float, default=40.0, help="each member's link, Mbit/s (0: uncapped)"
    )
    parser.add_argument("--mb", type=int, default=192, help="the cache's size in MB")
    parser.add_argument("--shards", type=int, default=SHARDS, help="the cache's shards")
    parser.add_argument(
        "--per-member",
        type=int,
        default=2,
        help="chunks in flight per member (parallel_shards = this x members)",
    )
    parser.set_defaults(out=BENCH_DIR / "results" / "fleet.json")
    args = parser.parse_args()
    if not can_make_netns():
        sys.exit("bench/fleet.py makes network namespaces: run it as root, with `ip` installed")
    sizes = [int(s) for s in args.members.split(",")]
    link_mb_s = args.mbit / 8 * 1e6 / (1 << 20)
    results = []
    scratch = Path(tempfile.mkdtemp(prefix="fleet-"))
    with MotoServer(host="0.0.0.0") as moto:
        url, endpoint, env = moto.store()
        os.environ.update(env)  # the builder's credentials (child_env copies os.environ)
        builder = BenchDaemon(scratch, "builder", ("--store", url, "--store-endpoint", endpoint))
        try:
            builder.start()
            ds, n = source(args.mb)
            with CacheClient(builder.target) as cc:
                cache = write_sharded(
                    cc,
                    ds,
                    "fleet-bench",
                    shard_bytes=args.mb * (1 << 20) // args.shards,
                    chunk_bytes=128 << 10,
                    batch_elements=8,
                )
                while cc.info("fleet-bench").store_state != "STORED":
                    time.sleep(0.2)
            stored_mb = cache.stored_bytes / (1 << 20)
            print(
                f"cache: {n} elements, {len(cache.shards)} shards, {stored_mb:.1f} MB stored; "
                f"links {args.mbit:g} Mbit/s ({link_mb_s:.2f} MB/s) each",
                flush=True,
            )
        finally:
            builder.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        for members in sizes:
            fleet = NetnsFleet(moto.port, env, url, metrics=True)
            try:
                for i in range(members):
                    fleet.add()
                    if args.mbit:
                        fleet.rate(i, args.mbit)
                with CacheClient(targets=fleet.targets) as cc:
                    parallel = args.per_member * members
                    epoch(cc, "fleet-bench", parallel, n)  # each member pulls what it owns
                    before = read_bytes(fleet)
                    times = [epoch(cc, "fleet-bench", parallel, n) for _ in range(args.repeat)]
                served = [b - a for a, b in zip(before, read_bytes(fleet))]
            finally:
                fleet.close()
            rates = [stored_mb / t for t in times]
            links = members * link_mb_s or float("nan")  # uncapped: no ratio
            row = {
                "members": members,
                "best_mb_s": max(rates),
                "median_mb_s": statistics.median(rates),
                "links_mb_s": members * link_mb_s,
                "best_vs_links": max(rates) / links,
                "median_vs_links": statistics.median(rates) / links,
                "busiest_vs_mean": max(served) / (sum(served) / members),
                "epoch_s": times,
            }
            results.append(row)
            print(
                f"{members} members: best {row['best_mb_s']:.1f} MB/s, median "
                f"{row['median_mb_s']:.1f} MB/s = {row['best_vs_links']:.2f}x / "
                f"{row['median_vs_links']:.2f}x the links' {row['links_mb_s']:.1f} MB/s; "
                f"busiest member {row['busiest_vs_mean']:.2f}x the mean",
                flush=True,
            )
    write_json(
        args.out,
        {
            "mbit": args.mbit,
            "mb": args.mb,
            "shards": args.shards,
            "per_member": args.per_member,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
