"""Epoch 2 over gRPC vs the same-host direct path vs ``Dataset.load``, interleaved in one process.

Run from the repository root::

    .venv/bin/python bench/direct_ab.py --workload image --n 1000 --rounds 3
    .venv/bin/python bench/direct_ab.py --workload small --n 200000 --rounds 3

Starts a daemon on a unix socket (data dir in a temp dir), writes the workload's elements
once through ``cc.cache()`` and once with ``Dataset.save``, then runs ``--rounds`` rounds of
one warm epoch each of: ``Dataset.load``, ``cc.dataset(direct=False)`` (gRPC),
``cc.dataset(direct=True)`` (direct), and ``ds.cache(file)`` (its second epoch), in that
order every round, all batched by 256 like bench/run.py. Interleaving in one process puts the
strategies under the same machine load (the machine is shared), so the ratios (median epoch
time of load / of the strategy) are what to read; the absolute rates move with the load.
The CPU seconds each epoch cost the client process and the daemon (medians, from
/proc/PID/stat) move much less with the load than wall time does.
Prints a markdown table on stdout. Under ``py-spy record --threads --idle -f raw``, a
``--only direct`` run gives the profile of the direct path alone.

``--baseline-root DIR`` (a checkout of another revision, e.g. ``git archive main | tar -x -C
DIR``) adds before/after rows in the same run: every round also reads the same cache, over
gRPC and directly, with DIR's client code. Each such epoch, and the same epoch with this
tree's code, then runs in a child process of its own (one warm-up epoch, then the timed one),
so both revisions' clients are measured the same way, interleaved under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
# a --child reads with the client (and store) of the checkout it runs in, which may be another's
sys.path.insert(0, str(Path.cwd() if "--child" in sys.argv else REPO_ROOT))
sys.path.insert(0, str(BENCH_DIR))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


ORDER = ("load", "grpc", "direct", "file")
CHILD_ORDER = ("grpc", "direct")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process pid so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="image")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--only", choices=ORDER, nargs="+", default=list(ORDER))
    parser.add_argument("--baseline-root", type=Path, default=None,
                        help="another checkout: add its client's gRPC and direct epochs")
    parser.add_argument("--child", nargs=2, metavar=("TARGET", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(*args.child, args.batch_size)

    import tensorflow as tf
    from daemons import BenchDaemon
    from strategies import timed_iteration
    from workloads import WORKLOADS, make_source

    from client import CacheClient

    workload = WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory(prefix="direct-ab-") as tmp_name:
        tmp = Path(tmp_name)
        daemon = BenchDaemon(tmp / "data", tmp / "d.sock", tmp / "daemon.log",
                             extra_args=("--log-level", "warning"))
        target = daemon.address
        try:
            daemon.start()
            src = make_source(workload, args.n)
            with CacheClient(target) as cc:
                for _ in cc.cache(src, "ab").batch(args.batch_size):
                    pass  # epoch 1 writes the cache through
                src.save(str(tmp / "saved"))
                file_ds = src.cache(str(tmp / "file-cache")).batch(args.batch_size)
                timed_iteration(file_ds)  # epoch 1 writes the cache(file) files
                datasets = {
                    "load": tf.data.Dataset.load(str(tmp / "saved")).batch(args.batch_size),
                    "grpc": cc.dataset("ab", direct=False).batch(args.batch_size),
                    "direct": cc.dataset("ab", direct=True).batch(args.batch_size),
                    "file": file_ds,
                }
                keys = list(args.only)
                if args.baseline_root is not None:
                    keys += [f"{root}-{mode}" for mode in CHILD_ORDER for root in ("base", "new")]
                seconds: dict[str, list[float]] = {k: [] for k in keys}
                cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in keys}
                for _round in range(args.rounds):
                    for key in keys:
                        before = (_cpu(os.getpid()), _cpu(daemon.pid))
                        if key in datasets:
                            result = timed_iteration(datasets[key])
                            elements, took, client_cpu = result.elements, result.seconds, None
                        else:
                            root, mode = key.split("-")
                            elements, took, client_cpu = _run_child(
                                args.baseline_root if root == "base" else REPO_ROOT, target, mode,
                                args.batch_size)
                        after = (_cpu(os.getpid()), _cpu(daemon.pid))
                        assert elements == args.n, (key, elements)
                        seconds[key].append(took)
                        cpu[key].append((after[0] - before[0] if client_cpu is None
                                         else client_cpu, after[1] - before[1]))
                        print(f"{key}: {took:.3f}s, CPU s client {cpu[key][-1][0]:.2f} "
                              f"daemon {cpu[key][-1][1]:.2f}", file=sys.stderr, flush=True)
                info = cc.info("ab")
        finally:
            daemon.stop()
    element = workload.element_bytes
    base = statistics.median(seconds["load"]) if "load" in seconds else None
    print(f"Reproduce: `.venv/bin/python bench/direct_ab.py --workload {args.workload} "
          f"--n {args.n} --rounds {args.rounds}` (load average at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; cache: {info.num_shards} shards, "
          f"{info.direct_reads} direct passes)\n")
    print("| epoch 2 of | median s | min-max s | elements/s | MB/s | vs `Dataset.load` | "
          "CPU s client + daemon |")
    print("|---|---|---|---|---|---|---|")
    labels = {"load": "`Dataset.load`", "grpc": "shardcache over gRPC",
              "direct": "shardcache direct", "file": "`cache(file)`",
              "base-grpc": "gRPC, baseline's client (child process)",
              "new-grpc": "gRPC, this tree's client (child process)",
              "base-direct": "direct, baseline's client (child process)",
              "new-direct": "direct, this tree's client (child process)"}
    for key, values in seconds.items():
        med = statistics.median(values)
        ratio = f"{base / med:.2f}x" if base else "-"
        client_cpu = statistics.median(c for c, _ in cpu[key])
        daemon_cpu = statistics.median(d for _, d in cpu[key])
        print(f"| {labels[key]} | {med:.3f} | {min(values):.3f}-{max(values):.3f} | "
              f"{args.n / med:,.0f} | {args.n * element / med / 1e6:,.0f} | {ratio} | "
              f"{client_cpu:.2f} + {daemon_cpu:.2f} |")
    return 0


def _run_child(root: Path, target: str, mode: str, batch_size: int
               ) -> tuple[int, float, float]:
    """One warm-up and one timed epoch of cache "ab" read by root's client in a child:
    (elements, seconds, client CPU seconds of the timed epoch)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--batch-size",
                          str(batch_size), "--child", target, mode], cwd=root, env=env,
                         check=True, capture_output=True, text=True).stdout
    elements, seconds, cpu = out.split()[-3:]
    return int(elements), float(seconds), float(cpu)


def _child(target: str, mode: str, batch_size: int) -> int:
    """In a child process: the client imported from the cwd's checkout reads cache "ab"."""
    from strategies import timed_iteration

    import client
    from client import CacheClient

    assert Path(client.__file__).resolve().parents[1] == Path.cwd().resolve(), client.__file__
    with CacheClient(target) as cc:
        ds = cc.dataset("ab", direct=mode == "direct").batch(batch_size)
        timed_iteration(ds)  # warm-up: TF's first-iteration costs, malloc tuning
        before = _cpu(os.getpid())
        result = timed_iteration(ds)
        print(result.elements, result.seconds, _cpu(os.getpid()) - before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
