"""Reproduces docs/benchmarks.md, "NumPy reader".

The NumPy reader (cc.numpy) beside the tf.data reader (cc.dataset) on one cache, interleaved.

    .venv/bin/python bench/numpy_read.py --workload flat-602k --elements 600
    .venv/bin/python bench/numpy_read.py --workload flat-1k --elements 100000

Both read the same cache in batches of ``--batch`` (0: elements one by one), directly (the
shard files under a read lease, a client on the daemon's unix socket) and over the data plane
(a client on its TCP address, ``direct=False``). Every arm is read once to warm up, then
``--repeat`` times in turn, so that each meets the same noise; the table gives each arm's best
epoch, its median, and the NumPy reader's ratio to the tf.data reader of the same mode (best
epochs).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import BenchDaemon, arguments, write_json
from probes import cpu_seconds, run_line
from timing import Arm, local_arm, markdown_table, ratio
from workloads import WORKLOADS, make_source

#: Which client reads, and whether directly.
MODES = {"direct": ("unix", True), "plane": ("tcp", False)}


def elements_arm(iterable: Callable[[], Any], n: int) -> Arm:
    """An epoch of elements one by one (--batch 0): as_numpy_iterator() of tf.data's, or
    cc.numpy() without batch_size."""

    def read() -> tuple[float, float]:
        before = cpu_seconds()
        start = time.perf_counter()
        elements = sum(1 for _ in iterable())
        seconds = time.perf_counter() - start
        if elements != n:
            raise RuntimeError(f"an epoch yielded {elements} elements, not {n}")
        return n / seconds, cpu_seconds() - before

    return read


def numpy_arm(reader: Any, n: int) -> Arm:
    """An epoch of cc.numpy()'s batches, each touched as a trainer would take it (its
    features' first item, its labels summed)."""

    def read() -> tuple[float, float]:
        before = cpu_seconds()
        start = time.perf_counter()
        elements = 0
        for features, labels in reader:
            elements += len(labels)
            features.reshape(-1)[:1].sum()
            labels.sum()
        seconds = time.perf_counter() - start
        if elements != n:
            raise RuntimeError(f"an epoch yielded {elements} elements, not {n}")
        return n / seconds, cpu_seconds() - before

    return read


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, out=True, repeat=5)
    parser.add_argument("--workload", default="flat-602k", choices=sorted(WORKLOADS))
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument(
        "--batch",
        type=int,
        default=64,
        help="elements per batch; 0: elements one by one (tf.data's "
        "as_numpy_iterator() beside cc.numpy() without batch_size)",
    )
    args = parser.parse_args(argv)
    from client import CacheClient

    tmp = Path(tempfile.mkdtemp(prefix="numpy-read-"))
    daemon = BenchDaemon(tmp, "head", tcp=True)
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float]]] = {}
    try:
        daemon.start()
        with CacheClient(daemon.target) as cc, CacheClient(str(daemon.tcp_target)) as remote:
            clients = {"unix": cc, "tcp": remote}
            for _ in cc.cache(make_source(WORKLOADS[args.workload], args.elements), "ab"):
                pass
            arms: dict[str, Arm] = {}
            for mode, (client, direct) in MODES.items():
                if not args.batch:
                    ds = clients[client].dataset("ab", direct=direct)
                    arms[f"tf.data {mode}"] = elements_arm(ds.as_numpy_iterator, args.elements)
                    arms[f"numpy {mode}"] = elements_arm(
                        clients[client].numpy("ab", direct=direct).__iter__, args.elements
                    )
                    continue
                arms[f"tf.data {mode}"] = local_arm(
                    clients[client].dataset("ab", direct=direct).batch(args.batch), args.elements
                )
                arms[f"numpy {mode}"] = numpy_arm(
                    clients[client].numpy("ab", direct=direct, batch_size=args.batch), args.elements
                )
            for arm in arms.values():  # warm-up
                arm()
            for i in range(args.repeat):
                for name, arm in arms.items():
                    daemon_before = cpu_seconds(daemon.pid)
                    rate, client_cpu = arm()
                    rates.setdefault(name, []).append(rate)
                    cpu.setdefault(name, []).append(
                        (client_cpu, cpu_seconds(daemon.pid) - daemon_before)
                    )
                print(f"pass {i + 1}/{args.repeat} done", file=sys.stderr)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {name: max(r) for name, r in rates.items()}
    print(run_line())
    print(
        markdown_table(
            [
                "reader",
                "best elements/s",
                "median",
                "vs tf.data (same mode)",
                "CPU s client + daemon (median)",
            ],
            (
                [
                    name,
                    f"{rate:,.0f}",
                    f"{statistics.median(rates[name]):,.0f}",
                    ratio(rate, best["tf.data " + name.split()[-1]]),
                    f"{statistics.median(c for c, _ in cpu[name]):.2f} + "
                    f"{statistics.median(d for _, d in cpu[name]):.2f}",
                ]
                for name, rate in best.items()
            ),
        )
    )
    write_json(args.out, {"command": run_line(), "rates": rates, "cpu": cpu})
    return 0


if __name__ == "__main__":
    sys.exit(main())
