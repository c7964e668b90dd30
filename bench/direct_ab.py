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
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCH_DIR))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from cacheserver.probe import wait_healthy  # noqa: E402

ORDER = ("load", "grpc", "direct", "file")


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
    args = parser.parse_args(argv)

    import tensorflow as tf
    from strategies import timed_iteration
    from workloads import WORKLOADS, make_source

    from client import CacheClient

    workload = WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory(prefix="direct-ab-") as tmp_name:
        tmp = Path(tmp_name)
        target = f"unix://{tmp}/d.sock"
        daemon = subprocess.Popen(
            [sys.executable, "-m", "cacheserver", "serve", "--data-dir", str(tmp / "data"),
             "--listen", target, "--log-level", "warning"], cwd=REPO_ROOT)
        try:
            wait_healthy(target, still_starting=lambda: daemon.poll() is None)
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
                seconds: dict[str, list[float]] = {k: [] for k in args.only}
                cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in args.only}
                for _round in range(args.rounds):
                    for key in args.only:
                        before = (_cpu(os.getpid()), _cpu(daemon.pid))
                        result = timed_iteration(datasets[key])
                        after = (_cpu(os.getpid()), _cpu(daemon.pid))
                        assert result.elements == args.n, (key, result.elements)
                        seconds[key].append(result.seconds)
                        cpu[key].append((after[0] - before[0], after[1] - before[1]))
                        print(f"{key}: {result.seconds:.3f}s, CPU s client {cpu[key][-1][0]:.2f} "
                              f"daemon {cpu[key][-1][1]:.2f}", file=sys.stderr, flush=True)
                info = cc.info("ab")
        finally:
            daemon.terminate()
            daemon.wait()
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
              "direct": "shardcache direct", "file": "`cache(file)`"}
    for key, values in seconds.items():
        med = statistics.median(values)
        ratio = f"{base / med:.2f}x" if base else "-"
        client_cpu = statistics.median(c for c, _ in cpu[key])
        daemon_cpu = statistics.median(d for _, d in cpu[key])
        print(f"| {labels[key]} | {med:.3f} | {min(values):.3f}-{max(values):.3f} | "
              f"{args.n / med:,.0f} | {args.n * element / med / 1e6:,.0f} | {ratio} | "
              f"{client_cpu:.2f} + {daemon_cpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
