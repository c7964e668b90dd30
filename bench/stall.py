"""Reproduces docs/benchmarks.md, "The input stall".

The input stall as the training process, the daemon's /metrics and ``cacheserver top`` see it,
for a loop its input starves and for one it keeps ahead of.

    .venv/bin/python bench/stall.py                          # the two cases below
    .venv/bin/python bench/stall.py --cases grpc:0,capped:100,plane:100 --mbit 200

One daemon, one cache of the workload; as root, the daemon runs in a network namespace of
its own, joined to the bench's by a veth pair (tests/fleet.py's NetnsLink), so a data-plane
read crosses a real link that tc can cap. Each case is ``PATH:STEP_MS``: a training loop over
``cc.timed(cc.dataset(...).batch(--batch).prefetch(AUTOTUNE))`` that spends STEP_MS per batch
(a sleep standing for the accelerator's step), reading over PATH: ``capped`` (the data plane
over the link capped at ``--mbit`` both ways: a reader its input starves), ``plane`` (the
same link uncapped), ``grpc`` (a client on the daemon's unix socket, ``direct=False``) or
``direct`` (the shard files). For each, the share of the wall time the loop waited: the
loop's own time in ``next()`` (the truth), ``client.InputStall`` (what
``client.InputStallCallback`` reports), and the rate of the daemon's
``shardcache_reader_stall_seconds_total`` over the same time (what ``cacheserver top`` and
the dashboard show).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import arguments, linked_daemon
from probes import run_line
from timing import markdown_table
from workloads import WORKLOADS, make_source

from tests.fleet import NetnsLink, can_make_netns


def scraped_stall(url: str) -> float:
    """Seconds of stall the daemon's readers reported, summed."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "shardcache_reader_stall_seconds_total"
    )


def loop(ds: Any, epochs: int, step_ms: float) -> float:
    """Seconds the loop spent in next() over epochs of ds, sleeping step_ms per batch."""
    in_next = 0.0
    for _ in range(epochs):
        it = iter(ds)
        while True:
            asked = time.monotonic()
            try:
                next(it)
            except StopIteration:
                break
            in_next += time.monotonic() - asked
            time.sleep(step_ms / 1000)
    return in_next


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--workload", default="flat-602k", choices=sorted(WORKLOADS))
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--mbit", type=float, default=400, help="the capped link's rate, both ways (default 400)"
    )
    parser.add_argument(
        "--cases",
        default="capped:100,plane:100",
        help="comma-separated PATH:STEP_MS (capped, plane, grpc or direct)",
    )
    args = parser.parse_args(argv)
    cases = [
        (path, float(step or 0))
        for path, _, step in (case.partition(":") for case in args.cases.split(","))
    ]
    if any(path in ("capped", "plane") for path, _ in cases) and not can_make_netns():
        parser.error("capped and plane cases need root and `ip netns` (a veth link to cap)")
    import tensorflow as tf

    from client import CacheClient, InputStall

    tmp = Path(tempfile.mkdtemp(prefix="stall-"))
    rows = []
    with contextlib.ExitStack() as stack:
        link = NetnsLink(1) if can_make_netns() else None
        if link is not None:
            stack.callback(link.close)
        daemon, metrics = linked_daemon(tmp, "stall", link)
        daemon.start()
        stack.callback(daemon.stop)
        with CacheClient(daemon.target) as cc:
            for _ in cc.cache(make_source(WORKLOADS[args.workload], args.elements), "stall"):
                pass
        for path, step_ms in cases:
            if link is not None and path == "capped":
                link.rate(args.mbit)
            target = str(daemon.tcp_target) if path in ("capped", "plane") else daemon.target
            with CacheClient(target, job=f"{path}-{step_ms:g}ms") as cc:
                ds = cc.timed(
                    cc.dataset("stall", direct=path == "direct")
                    .batch(args.batch)
                    .prefetch(tf.data.AUTOTUNE)
                )
                loop(ds, 1, 0)  # a warm-up epoch
                before = scraped_stall(f"http://{metrics}/metrics")
                stall, began = InputStall(), time.monotonic()
                in_next = loop(ds, args.epochs, step_ms)
                waited = stall.fraction()
                wall = time.monotonic() - began
            # the client's close() sent its last report
            reported = (scraped_stall(f"http://{metrics}/metrics") - before) / wall
            if link is not None and path == "capped":
                link.rate(None)
            label = f"data plane, {args.mbit:g} Mbit/s" if path == "capped" else path
            rows.append(
                (
                    label,
                    f"{step_ms:g} ms",
                    f"{args.elements * args.epochs / wall:,.0f}",
                    f"{100 * in_next / wall:.0f}%",
                    f"{100 * waited:.0f}%",
                    f"{100 * reported:.0f}%",
                )
            )
    print(f"{run_line()}\n")
    print(
        markdown_table(
            (
                "path",
                "step per batch",
                "elements/s",
                "loop in next()",
                "client.InputStall",
                "daemon's /metrics",
            ),
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
