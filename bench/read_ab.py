"""Reproduces docs/benchmarks.md, "Read paths, interleaved" (and "Scaling with cores", ...).

Warm reads interleaved in one process: shardcache's direct, data-plane and gRPC reads, by
``parallel_shards`` (``--parallel``, 0: AUTOTUNE), beside tf.data's in-memory ``cache()``,
``cache(filename)``, ``snapshot`` (uncompressed) and ``Dataset.load`` of the same source.

    .venv/bin/python bench/read_ab.py --parallel 0,2,8 --repeat 5
    .venv/bin/python bench/read_ab.py --modes direct,grpc ...   # some of the three reads
    taskset -c 0 .venv/bin/python bench/read_ab.py ...      # on one core
    .venv/bin/python bench/read_ab.py --daemon-cpus 0 --reader-cpus 1   # as if two hosts
    .venv/bin/python bench/read_ab.py --map ...             # elements through a map
    .venv/bin/python bench/read_ab.py --in-graph ...        # batches taken in a tf.function

``--map`` reads ``ds.map(identity).batch(B)`` instead of ``ds.batch(B)``: elements one by
one through tf.data's ``unbatch``, the path of a pipeline that maps the cache's elements,
instead of the cache's own ``batch()`` (the batches read as batches).

``--in-graph`` takes each epoch's batches inside a ``tf.function`` (``for batch in
iterator`` traced), as ``model.fit`` does, instead of the Python loop of a custom training
loop: no Python runs between batches, so none contends for the GIL with a read's own
Python (its numpy_function per batch).

``--daemon-cpus``/``--reader-cpus`` pin the daemon and this process (the reads, tf.data's
threads) to CPU sets of their own, as if the daemon ran on another host.

``--observed`` adds, for each shardcache read, the same read by a client that reports
nothing (``CacheClient(report=False)``: no counts) and the read wrapped in ``cc.timed()``
(the input stall timed on top of the batches), with a second table of their ratios to the
plain read: what observing a read costs it.

The daemon listens on a unix socket and on 127.0.0.1. ``direct``: a client on the socket
reading the shard files under a read lease (``direct=True``); ``plane``: a client on the TCP
address, remote to the daemon, reading over its data plane (``direct=False``; gRPC where
``$SHARDCACHE_DATA_PLANE=off`` or the checkout has none); ``grpc``: a client on the socket,
reading over gRPC (``direct=False``: a unix socket has no data plane).

Every strategy is read once to warm up, then ``--repeat`` times in turn (A, B, C, A, B, C,
...), so that every one meets the same noise; the table gives each one's best epoch, its
median, the best epochs' ratios and the median CPU seconds of reader and daemon.
``--baseline-root`` adds the shardcache reads of another checkout's client and daemon, read
by a child process of each checkout at its turn (rows ``... @base`` and ``... @head``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import (
    BENCH_DIR,
    REPO_ROOT,
    ROOT_ENV,
    BenchDaemon,
    arguments,
    child_env,
    print_result,
    read_result,
    write_json,
)
from probes import cpu_seconds, run_line
from timing import Arm, local_arm, markdown_table, ratio
from workloads import WORKLOADS, make_source

BASELINES = ("cache()", "cache(filename)", "snapshot", "Dataset.load")
#: shardcache's reads: which client reads, and whether directly.
MODES = {"direct": ("unix", True), "plane": ("tcp", False), "grpc": ("unix", False)}
#: --observed's variants of each read: without reports, and timed on top.
OBSERVED = ("report=False", "cc.timed()")


def batched(ds: Any, batch: int, mapped: bool) -> Any:
    """ds.batch(batch), through an identity map first when mapped (``--map``)."""
    return (ds.map(lambda *e: e[0] if len(e) == 1 else e) if mapped else ds).batch(batch)


def shardcache_reads(
    clients: dict[str, Any],
    src: Any,
    batch: int,
    parallel: list[int],
    modes: list[str],
    mapped: bool = False,
) -> dict[str, Any]:
    """The cache written through ``clients["unix"]`` (once), and its reads per parallel and
    mode (:data:`MODES`); ``clients["tcp"]`` reads remotely."""
    for _ in clients["unix"].cache(src, name="ab"):
        pass
    reads = {}
    for p in parallel:
        tag = "auto" if p == 0 else str(p)
        for mode in modes:
            client, direct = MODES[mode]
            reads[f"{mode} p={tag}"] = batched(
                clients[client].dataset("ab", direct=direct, parallel_shards=p), batch, mapped
            )
    return reads


def cpu_list(text: str) -> set[int]:
    """taskset's CPU list ("1", "0,2", "0-3") as a set."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise SystemExit(f"--modes {text!r}: a comma-separated list of {', '.join(MODES)}")
    return modes


def tf_data_reads(src: Any, tmp: Path, batch: int, mapped: bool = False) -> dict[str, Any]:
    """tf.data's caches of ``src``, written once: the baselines."""
    import tensorflow as tf

    memory = src.cache()  # tf.data's in-memory cache: what shardcache replaces
    for _ in memory:
        pass
    cached = src.cache(str(tmp / "file"))
    for _ in cached:
        pass
    for _ in src.snapshot(str(tmp / "snapshot"), compression=None):
        pass
    src.save(str(tmp / "saved"))
    return {
        "cache()": batched(memory, batch, mapped),
        "cache(filename)": batched(cached, batch, mapped),
        "snapshot": batched(src.snapshot(str(tmp / "snapshot"), compression=None), batch, mapped),
        "Dataset.load": batched(tf.data.Dataset.load(str(tmp / "saved")), batch, mapped),
    }


class ChildArms:
    """A process reading with another checkout's client: one epoch per name it is sent."""

    def __init__(
        self, root: Path, label: str, daemon: BenchDaemon, args: argparse.Namespace
    ) -> None:
        cmd = [
            sys.executable,
            str(BENCH_DIR / "read_ab.py"),
            "--child",
            daemon.target,
            "--child-tcp",
            str(daemon.tcp_target),
            "--workload",
            args.workload,
            "--elements",
            str(args.elements),
            "--batch",
            str(args.batch),
            "--parallel",
            args.parallel,
            "--modes",
            args.modes,
            *(["--map"] if args.map else []),
            *(["--in-graph"] if args.in_graph else []),
        ]
        self.label = label
        self.proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=child_env(root),
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.names: list[str] = self._answer()["names"]

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if (answer := read_result(line)) is not None:
                return answer
        raise RuntimeError(f"the {self.label} reader exited ({self.proc.wait()})")

    def arm(self, name: str) -> Arm:
        def read() -> tuple[float, float]:
            assert self.proc.stdin is not None
            self.proc.stdin.write(name + "\n")
            self.proc.stdin.flush()
            answer = self._answer()
            return answer["rate"], answer["cpu"]

        return read

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def child(args: argparse.Namespace) -> int:
    """In a child: write (or find) the cache, warm every read, then one epoch per line."""
    import client
    from client import CacheClient

    root = Path(os.environ.get(ROOT_ENV, REPO_ROOT)).resolve()
    assert Path(client.__file__).resolve().is_relative_to(root), client.__file__
    with CacheClient(args.child) as cc, CacheClient(args.child_tcp) as remote:
        src = make_source(WORKLOADS[args.workload], args.elements)
        reads = shardcache_reads(
            {"unix": cc, "tcp": remote},
            src,
            args.batch,
            [int(p) for p in args.parallel.split(",")],
            parse_modes(args.modes),
            args.map,
        )
        arms = {name: local_arm(ds, args.elements, args.in_graph) for name, ds in reads.items()}
        for arm in arms.values():  # warm-up
            arm()
        print_result({"names": list(arms)})
        for line in sys.stdin:
            rate, cpu = arms[line.strip()]()
            print_result({"rate": rate, "cpu": cpu})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, baseline=True, out=True, repeat=7)
    parser.add_argument("--workload", default="flat-602k", choices=sorted(WORKLOADS))
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--parallel", default="0", help="comma-separated chunks in flight (0: AUTOTUNE)"
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated shardcache reads (default {','.join(MODES)})",
    )
    parser.add_argument(
        "--map",
        action="store_true",
        help="read ds.map(identity).batch(B): elements through unbatch",
    )
    parser.add_argument(
        "--in-graph",
        action="store_true",
        help="take each epoch's batches inside a tf.function, as model.fit does, instead "
        "of a Python loop",
    )
    parser.add_argument(
        "--observed",
        action="store_true",
        help="also each read without reports, and wrapped in cc.timed()",
    )
    parser.add_argument(
        "--daemon-cpus", metavar="LIST", help="pin the daemon to these CPUs (taskset's list)"
    )
    parser.add_argument(
        "--reader-cpus", metavar="LIST", help="pin this process, the reader, to these CPUs"
    )
    parser.add_argument("--child", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--child-tcp", metavar="TARGET", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.reader_cpus:  # before TensorFlow sizes its thread pools
        os.sched_setaffinity(0, cpu_list(args.reader_cpus))
    from client import CacheClient

    parallel = [int(p) for p in args.parallel.split(",")]
    modes = parse_modes(args.modes)
    tmp = Path(tempfile.mkdtemp(prefix="read-ab-"))
    pinned = ["taskset", "-c", args.daemon_cpus] if args.daemon_cpus else []
    daemons = {"head": BenchDaemon(tmp, "head", tcp=True, prefix=pinned)}
    if args.baseline_root is not None:
        daemons["base"] = BenchDaemon(
            tmp, "base", root=args.baseline_root.resolve(), tcp=True, prefix=pinned
        )
    children: list[ChildArms] = []
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float]]] = {}
    try:
        for daemon in daemons.values():
            daemon.start()
        with (
            CacheClient(daemons["head"].target) as cc,
            CacheClient(str(daemons["head"].tcp_target)) as remote,
            CacheClient(daemons["head"].target, report=False) as quiet,
            CacheClient(str(daemons["head"].tcp_target), report=False) as quiet_remote,
        ):
            src = make_source(WORKLOADS[args.workload], args.elements)
            reads = tf_data_reads(src, tmp, args.batch, args.map)
            ours = shardcache_reads(
                {"unix": cc, "tcp": remote}, src, args.batch, parallel, modes, args.map
            )
            reads |= ours
            if args.observed:
                unreported = shardcache_reads(
                    {"unix": quiet, "tcp": quiet_remote}, src, args.batch, parallel, modes, args.map
                )
                reads |= {f"{name}, {OBSERVED[0]}": ds for name, ds in unreported.items()}
                reads |= {f"{name}, {OBSERVED[1]}": cc.timed(ds) for name, ds in ours.items()}
            arms: dict[str, tuple[Arm, BenchDaemon | None]] = {
                name: (
                    local_arm(ds, args.elements, args.in_graph),
                    daemons["head"] if name not in BASELINES else None,
                )
                for name, ds in reads.items()
            }
            if args.baseline_root is not None:
                for label, daemon in daemons.items():
                    children.append(ChildArms(daemon.root, label, daemon, args))
                    arms |= {
                        f"{name} @{label}": (children[-1].arm(name), daemon)
                        for name in children[-1].names
                    }
            for arm, _ in arms.values():  # warm-up
                arm()
            for i in range(args.repeat):
                for name, (arm, daemon) in arms.items():
                    daemon_before = cpu_seconds(daemon.pid) if daemon else 0.0
                    rate, client_cpu = arm()
                    daemon_cpu = cpu_seconds(daemon.pid) - daemon_before if daemon else 0.0
                    rates.setdefault(name, []).append(rate)
                    cpu.setdefault(name, []).append((client_cpu, daemon_cpu))
                print(f"pass {i + 1}/{args.repeat} done", file=sys.stderr)
    finally:
        for reader in children:
            reader.close()
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {name: max(r) for name, r in rates.items()}
    print(run_line())
    print(
        markdown_table(
            [
                "strategy",
                "best elements/s",
                "median",
                *(f"vs `{b}`" for b in BASELINES),
                "CPU s client + daemon (median)",
            ],
            (
                [
                    name,
                    f"{rate:,.0f}",
                    f"{statistics.median(rates[name]):,.0f}",
                    *(ratio(rate, best[b]) for b in BASELINES),
                    f"{statistics.median(c for c, _ in cpu[name]):.2f} + "
                    f"{statistics.median(d for _, d in cpu[name]):.2f}",
                ]
                for name, rate in best.items()
            ),
        )
    )
    if args.observed:

        def against(name: str, variant: str) -> str:
            median = statistics.median
            return (
                f"{ratio(best[f'{name}, {variant}'], best[name])}, "
                f"{ratio(median(rates[f'{name}, {variant}']), median(rates[name]))}"
            )

        print()
        print(
            markdown_table(
                ["read", *(f"{o}: best, median vs the plain read" for o in OBSERVED)],
                ([name, *(against(name, o) for o in OBSERVED)] for name in ours),
            )
        )
    write_json(args.out, {"command": run_line(), "rates": rates, "cpu": cpu})
    return 0


if __name__ == "__main__":
    sys.exit(main())
