"""Reproduces docs/reading.md, "Mixing caches".

A weighted mix of many caches against one cache of the same elements: elements/s and the
reading process's peak anonymous RSS.

    .venv/bin/python bench/mix.py --workload small --elements 40000 --sources 32 --repeat 5
    .venv/bin/python bench/mix.py --shuffle false --direct false ...

One daemon holds the whole source as one cache and, split into ``--sources`` contiguous
parts, as that many caches. ``one`` reads the single cache (``cc.dataset``), ``mix`` the
parts mixed by equal weights over epochs of the same size (``cc.mix``), both with the same
shuffle mode, direct setting and batch. Each arm is a process of its own, so that its
``RssAnon`` peak is its own; after a warm-up epoch each, they read one epoch in turn (A, B,
A, B, ...) to meet the same noise. The table gives each arm's best and median elements/s,
mix/one of the best epochs, and each process's peak RssAnon.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import (
    BENCH_DIR,
    BenchDaemon,
    arguments,
    child_env,
    print_result,
    read_result,
    write_json,
)
from probes import RssSampler, cpu_seconds, kib_to_mb, run_line
from timing import markdown_table, ratio, timed_iteration
from workloads import WORKLOADS, make_source

ARMS = ("one", "mix")


def parts(n: int, sources: int) -> list[tuple[int, int]]:
    return [(k * n // sources, (k + 1) * n // sources) for k in range(sources)]


def write_caches(target: str, workload: str, n: int, sources: int) -> None:
    from client import CacheClient

    source = make_source(WORKLOADS[workload], n)
    with CacheClient(target) as cc:
        for _ in cc.cache(source, "one"):
            pass
        for k, (lo, hi) in enumerate(parts(n, sources)):
            for _ in cc.cache(source.skip(lo).take(hi - lo), f"part-{k:03d}"):
                pass


def child(args: Any) -> None:
    """One arm's reader: an epoch per line on stdin, a RESULT line for each."""
    from client import CacheClient

    sampler = RssSampler().start()
    shuffle = {"false": False, "true": True, "shards": "shards"}[args.shuffle]
    direct = {"false": False, "true": True, "auto": "auto"}[args.direct]
    cc = CacheClient(args.child_target)
    if args.child == "one":
        ds = cc.dataset("one", shuffle=shuffle, seed=1, direct=direct)
    else:
        weights = {f"part-{k:03d}": 1 for k in range(args.sources)}
        ds = cc.mix(weights, size=args.elements, shuffle=shuffle, seed=1, direct=direct)
    ds = ds.batch(args.batch)
    print_result({"ready": True})
    for _ in sys.stdin:
        before = cpu_seconds()
        result = timed_iteration(ds)
        if result.elements != args.elements:
            raise RuntimeError(f"an epoch yielded {result.elements} elements")
        print_result(
            {
                "rate": result.elements / result.seconds,
                "cpu": cpu_seconds() - before,
                "peak_anon_kib": sampler.peak_anon_kib,
            }
        )


class Arm:
    def __init__(self, name: str, target: str, args: Any) -> None:
        cmd = [
            sys.executable,
            str(BENCH_DIR / "mix.py"),
            "--child",
            name,
            "--child-target",
            target,
            *(
                f"--{k}={getattr(args, k)}"
                for k in ("workload", "elements", "sources", "batch", "shuffle", "direct")
            ),
        ]
        self.proc = subprocess.Popen(
            cmd, env=child_env(), text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.results: list[dict[str, Any]] = []
        self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if (answer := read_result(line)) is not None:
                return answer
        raise RuntimeError(f"a reader exited ({self.proc.wait()})")

    def epoch(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("epoch\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = arguments(__doc__, out=True, repeat=5)
    parser.add_argument("--workload", default="small", choices=sorted(WORKLOADS))
    parser.add_argument("--elements", type=int, default=40_000)
    parser.add_argument("--sources", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shuffle", default="true", choices=("false", "true", "shards"))
    parser.add_argument("--direct", default="auto", choices=("false", "true", "auto"))
    parser.add_argument("--child", choices=ARMS, help=argparse_hidden())
    parser.add_argument("--child-target", help=argparse_hidden())
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="mix-", dir="/tmp") as tmp:
        daemon = BenchDaemon(Path(tmp), "d").start()
        try:
            write_caches(daemon.target, args.workload, args.elements, args.sources)
            arms = {name: Arm(name, daemon.target, args) for name in ARMS}
            for arm in arms.values():
                arm.epoch()  # warm-up
            for _ in range(args.repeat):
                for arm in arms.values():
                    arm.results.append(arm.epoch())
            for arm in arms.values():
                arm.close()
        finally:
            daemon.kill()
    best = {name: max(r["rate"] for r in arm.results) for name, arm in arms.items()}
    rows = [
        [
            name,
            f"{best[name]:,.0f}",
            f"{statistics.median(r['rate'] for r in arm.results):,.0f}",
            ratio(best[name], best["one"]),
            f"{kib_to_mb(arm.results[-1]['peak_anon_kib']):.0f}",
        ]
        for name, arm in arms.items()
    ]
    print(run_line())
    print(
        f"{args.workload}, {args.elements} elements, {args.sources} sources, shuffle="
        f"{args.shuffle}, direct={args.direct}, batch {args.batch}, {args.repeat} epochs each"
    )
    print(markdown_table(["read", "best el/s", "median el/s", "vs one", "peak RssAnon MB"], rows))
    write_json(args.out, {name: arm.results for name, arm in arms.items()})


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
