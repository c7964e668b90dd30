"""Reproduces docs/writing.md, "What a write epoch costs" (and README's "Speed", epoch 1).

Epoch 1 alone: the bare pipeline and the ways of caching it, as ratios to bare, in one run.

    .venv/bin/python bench/write_path.py --workload jpeg --n 600 --repeat 3

Strategies: ``none`` (the bare pipeline), ``memory``, ``file``, ``save``, ``shardcache``
(write-through, ``direct="auto"``: on the daemon's host the client writes the shard files)
and ``shardcache-grpc`` (``direct=False``). Each point is a ``measure.py --epochs 1``
process, round-robin over the strategies each repeat; a row's ratio is the median over
repeats of its time over bare's in the same repeat. ``--pipeline-threads 1`` leaves one core
of two to the write path. ``--baseline-root`` adds ``shardcache@base``, the other checkout's
client and daemon.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import MB, BenchDaemon, arguments
from measure import run_point
from probes import run_line
from timing import markdown_table
from workloads import WORKLOADS

#: This script's strategies: measure.py's strategy and client options for each.
STRATEGIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "none": ("none", ()),
    "memory": ("memory", ()),
    "file": ("file", ()),
    "save": ("save_load", ()),
    "shardcache": ("shardcache", ("direct=auto",)),
    "shardcache-grpc": ("shardcache", ()),
}


def measure(
    args: argparse.Namespace,
    strategy: str,
    scratch: Path,
    daemons: dict[str, BenchDaemon],
    repeat: int,
) -> dict[str, Any]:
    """Epoch 1 of one strategy in a measure.py process; its record, or RuntimeError."""
    name, options = STRATEGIES[strategy.split("@")[0]]
    daemon = (
        daemons["base" if strategy.endswith("@base") else "head"]
        if name.startswith("shardcache")
        else None
    )
    extra = [
        "--epochs",
        "1",
        "--pipeline-threads",
        str(args.pipeline_threads),
        *(f"--client-option={option}" for option in options),
    ]
    record = run_point(
        args.workload,
        args.n,
        name,
        scratch=scratch,
        daemon=daemon,
        cache_name=f"write-path-{strategy.replace('@', '-')}-{repeat}",
        extra_args=extra,
        timeout_s=args.timeout,
    )
    if record.get("status") != "ok":
        raise RuntimeError(f"{strategy}: {record.get('error')}")
    return record


def table(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    """Per strategy, epoch 1 against the bare pipeline's."""

    def epoch(record: dict[str, Any]) -> dict[str, Any]:
        first: dict[str, Any] = record["epochs"][0]
        return first

    def cpu(record: dict[str, Any]) -> tuple[float, float]:
        return epoch(record)["cpu_seconds"], epoch(record).get("daemon_cpu_seconds", 0.0)

    bare = [epoch(r)["seconds"] for r in runs["none"]]
    bare_cpu = statistics.median(sum(cpu(r)) for r in runs["none"])
    payload = WORKLOADS[args.workload].dataset_bytes(args.n) / MB
    rows = []
    for strategy, records in runs.items():
        secs = [epoch(r)["seconds"] for r in records]
        ok = all(epoch(r)["elements_ok"] and epoch(r)["label_sum_ok"] is not False for r in records)
        rows.append(
            [
                strategy,
                f"{statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f})",
                f"{statistics.median(s / b for s, b in zip(secs, bare)):.2f}x",
                f"{payload / statistics.median(secs):,.0f}",
                f"{statistics.median(cpu(r)[0] for r in records):.2f}",
                f"{statistics.median(cpu(r)[1] for r in records):.2f}",
                f"{statistics.median(sum(cpu(r)) for r in records) / bare_cpu:.2f}x",
                f"{max(epoch(r)['peak_rss_anon_mb'] for r in records):,.0f}",
                "ok" if ok else "FAILED",
            ]
        )
    return "\n".join(
        [
            f"`{args.workload}`, {args.n:,} elements ({payload:,.0f} MB), epoch 1, "
            f"{args.repeat} repeat(s), pipeline threads: {args.pipeline_threads or 'all cores'}; "
            f"bare pipeline: {payload / statistics.median(bare):,.0f} MB/s",
            "",
            markdown_table(
                [
                    "strategy",
                    "epoch 1 s (median, min-max)",
                    "ratio to bare (median)",
                    "MB/s",
                    "client CPU s",
                    "daemon CPU s",
                    "CPU vs bare",
                    "peak RssAnon MB",
                    "checks",
                ],
                rows,
            ),
            "",
            "CPU vs bare: the median CPU seconds (client + daemon) over the bare pipeline's.",
            "When the pipeline keeps both cores busy, an epoch costs about that ratio; the",
            "wall-clock ratio also moves with how well tf.data's autotuning fills the cores",
            "(docs/writing.md).",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, baseline=True, repeat=3)
    parser.add_argument("--workload", default="jpeg", choices=sorted(WORKLOADS))
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument(
        "--pipeline-threads",
        type=int,
        default=0,
        metavar="N",
        help="run the source's map on N threads (default 0: all cores)",
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    strategies = list(dict.fromkeys(["none", *args.strategies]))
    scratch = Path(tempfile.mkdtemp(prefix="wp-"))
    daemons: dict[str, BenchDaemon] = {}
    try:
        if any(s.startswith("shardcache") for s in strategies):
            daemons["head"] = BenchDaemon(scratch, "head")
            if args.baseline_root is not None:
                daemons["base"] = BenchDaemon(scratch, "base", root=args.baseline_root.resolve())
                strategies.append("shardcache@base")
            for daemon in daemons.values():
                daemon.start()
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in strategies}
        for repeat in range(args.repeat):
            for strategy in strategies:
                record = measure(args, strategy, scratch, daemons, repeat)
                runs[strategy].append(record)
                print(
                    f"{repeat} {strategy}: {record['epochs'][0]['seconds']:.2f} s", file=sys.stderr
                )
    finally:
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print(run_line())
    print(table(args, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
