"""The input stall as the training process, the daemon's /metrics and ``cacheserver top`` see it,
for a loop the cache cannot keep up with and for one it keeps ahead of.

    .venv/bin/python bench/stall.py                          # the two cases below
    .venv/bin/python bench/stall.py --cases grpc:0,plane:0,plane:100 --epochs 3

One daemon, one cache of the workload. Each case is ``PATH:STEP_MS``: a training loop over
``cc.dataset(...).batch(--batch).prefetch(AUTOTUNE)`` that spends STEP_MS per batch (a sleep
standing for the accelerator's step), reading over PATH: ``grpc`` (a client on the daemon's
unix socket, ``direct=False``: the slowest path, 0.2x the others), ``plane`` (a client on
its TCP address: the data plane) or ``direct`` (the shard files). ``grpc:0`` is a loop
starved by its input; ``plane:100`` one its input keeps ahead of. For each, the share of the
wall time its consumer waited: ``client.InputStall`` in the loop, and the rate of the
daemon's ``shardcache_reader_stall_seconds_total`` over the same time (what
``cacheserver top`` and the dashboard show), beside the share of the wall time the loop
itself spent in ``next()`` (the truth the two estimate: the stall is timed where chunks
enter tf.data, so the pipeline's own work above them, batching and copying, is not in it).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from harness import BenchDaemon, arguments, free_port, markdown_table, run_line
from workloads import WORKLOADS, make_source


def scraped_stall(url: str) -> float:
    """Seconds of stall the daemon's readers reported, summed."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == "shardcache_reader_stall_seconds_total")


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--workload", default="flat-602k", choices=sorted(WORKLOADS))
    parser.add_argument("--elements", type=int, default=1200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cases", default="grpc:0,plane:100",
                        help="comma-separated PATH:STEP_MS (grpc, plane or direct)")
    args = parser.parse_args(argv)
    import tensorflow as tf

    from client import CacheClient, InputStall

    tmp = Path(tempfile.mkdtemp(prefix="stall-"))
    metrics = f"127.0.0.1:{free_port()}"
    daemon = BenchDaemon(tmp, "stall", tcp=True, extra_args=("--metrics-listen", metrics))
    daemon.start()
    rows = []
    try:
        with CacheClient(daemon.target) as cc:
            for _ in cc.cache(make_source(WORKLOADS[args.workload], args.elements), "stall"):
                pass
        for case in args.cases.split(","):
            path, _, step = case.partition(":")
            step_ms = float(step or 0)
            target = str(daemon.tcp_target) if path == "plane" else daemon.target
            with CacheClient(target, job=f"{path}-{step_ms:g}ms", time_stall=True) as cc:
                ds = cc.dataset("stall", direct=path == "direct").batch(args.batch).prefetch(
                    tf.data.AUTOTUNE)
                for _ in ds:  # a warm-up epoch
                    pass
                before = scraped_stall(f"http://{metrics}/metrics")
                stall, began, in_next = InputStall(), time.monotonic(), 0.0
                for _ in range(args.epochs):
                    it = iter(ds)
                    while True:
                        asked = time.monotonic()
                        try:
                            next(it)
                        except StopIteration:
                            break
                        in_next += time.monotonic() - asked
                        time.sleep(step_ms / 1000)
                waited = stall.fraction()
                wall = time.monotonic() - began
            # the client's close() sent its last report
            reported = (scraped_stall(f"http://{metrics}/metrics") - before) / wall
            rows.append((path, f"{step_ms:g} ms", f"{args.elements * args.epochs / wall:,.0f}",
                         f"{100 * in_next / wall:.0f}%", f"{100 * waited:.0f}%",
                         f"{100 * reported:.0f}%"))
    finally:
        daemon.stop()
    print(f"{run_line()}\n")
    print(markdown_table(("path", "step per batch", "elements/s", "loop in next()",
                          "stall: client.InputStall", "stall: daemon's /metrics"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
