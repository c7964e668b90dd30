"""Reading at scale: throughput and client memory of ordered, shuffled and parallel reads.

    .venv/bin/python bench/read_scale.py                       # small 200k/800k, image 600/2400
    .venv/bin/python bench/read_scale.py --small 50000 --image 150 --repeat 1   # quicker

Starts one daemon on a unix socket in a temporary directory, builds the caches
(write-through, untimed), then measures each (workload, size, read mode) in a
fresh child process: one epoch of ``cc.dataset(...).batch(b)`` (b: 256 small, 16 images), warm page
cache, checked to yield every element once (label checksum), timed, with the
child's peak ``RssAnon`` sampled as bench/measure.py does. Each point runs
``--repeat`` times, round robin over the modes, and the fastest run counts: on
a shared machine, other load only ever slows a run down. Modes:

* ``sequential``: cc.dataset(name), the stored order (one ReadShard stream per
  shard), the baseline every ratio is taken against;
* ``shuffle``: shuffle=True (exact global shuffle); ``shards``: shuffle="shards";
* ``shuffle-p2``/``-p4``, ``sequential-p4``: the same with parallel_shards=2/4.

Prints one Markdown table per workload: elements/s, ratio to sequential, peak
RssAnon, and the ratio of the peak at 4x the data to the peak at 1x. CPU
µs/element is the client's plus the daemon's CPU time over the epoch, per
element (the least over the runs): unlike wall time it barely moves when other
processes compete for the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

MODES: dict[str, dict[str, Any]] = {
    "sequential": {},
    "sequential-p4": {"parallel_shards": 4},
    "shards": {"shuffle": "shards", "seed": 1},
    "shuffle": {"shuffle": True, "seed": 1},
    "shuffle-p2": {"shuffle": True, "seed": 1, "parallel_shards": 2},
    "shuffle-p4": {"shuffle": True, "seed": 1, "parallel_shards": 4},
}
MEMORY_MODES = ("sequential", "shuffle", "shuffle-p4")
PREFETCH_BYTES = 64 << 20
BATCHES = {"small": 256, "image": 16}  # image batches of 256 would hold 154 MB each
SHARD_BYTES = 32 << 20  # several shards even at these modest sizes


def _client_env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def build(socket: str, workload: str, n: int) -> None:
    """Child: write the cache (untimed), in shards of SHARD_BYTES so shard modes have shards."""
    from workloads import WORKLOADS, make_source

    from client import CacheClient
    from client._transport import pb
    from client.format.codec import encode_batch
    from client.format.values import Compressor
    from client.tf import convert
    from client.write.stream import CacheWriter

    ds = make_source(WORKLOADS[workload], n)
    spec = ds.element_spec
    layout = convert.layout_of(spec)
    fmt = convert.BatchFormat(spec, layout)
    with CacheClient("unix://" + socket) as cc:
        begin = pb.WriteBegin(name=f"{workload}-{n}", fingerprint=f"version:{workload}-{n}",
                              layout_json=layout.to_json(), element_spec=convert.encode_spec(spec),
                              shard_bytes=SHARD_BYTES)
        writer = CacheWriter(cc._transport, begin)
        writer.begin()
        compressor = Compressor()
        for count, batch in convert.source_batches(ds, fmt, 64):
            bodies = encode_batch(layout, batch, count)
            raw = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in bodies)
            writer.add([compressor.pack(b) for b in bodies], raw)
        writer.finish()


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time of a process so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(socket: str, workload: str, n: int, mode: str, daemon_pid: int) -> dict[str, Any]:
    """Child: one epoch of one read mode; throughput and peak RssAnon."""
    from measure import RssSampler, kib_to_mb
    from workloads import WORKLOADS, expected_label_sum

    sampler = RssSampler().start()
    from client import CacheClient

    baseline = kib_to_mb(sampler.sample())
    name = f"{workload}-{n}"
    with CacheClient("unix://" + socket) as cc:
        ds = cc.dataset(name, prefetch_bytes=PREFETCH_BYTES, **MODES[mode])
        ds = ds.batch(BATCHES[workload])
        for _ in ds.take(1):  # start TF's machinery untimed
            pass
        sampler.reset_window()
        cpu_before = cpu_seconds() + cpu_seconds(daemon_pid)
        start = time.perf_counter()
        count = total = 0
        for _, labels in ds.as_numpy_iterator():
            count += len(labels)
            total += int(labels.sum())
        seconds = time.perf_counter() - start
        cpu = cpu_seconds() + cpu_seconds(daemon_pid) - cpu_before
    sampler.stop()
    ok = count == n and total == expected_label_sum(WORKLOADS[workload], n)
    return {"workload": workload, "n": n, "mode": mode, "seconds": seconds,
            "elements_per_s": n / seconds, "cpu_us_per_element": 1e6 * cpu / n, "ok": ok,
            "baseline_mb": baseline,
            "peak_mb": kib_to_mb(sampler.peak_anon_kib)}


def _child(args: list[str]) -> dict[str, Any] | None:
    out = subprocess.run([sys.executable, __file__, *args], env=_client_env(), cwd=ROOT,
                         capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    if out.returncode:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-3000:]}")
    return None


def run(sizes: dict[str, int], repeat: int) -> list[dict[str, Any]]:
    from daemons import BenchDaemon

    results = []
    with tempfile.TemporaryDirectory(prefix="read-scale-") as tmp:
        socket = f"{tmp}/cs.sock"
        daemon = BenchDaemon(Path(tmp) / "data", Path(socket), Path(tmp) / "daemon.log",
                             extra_args=("--log-level", "warning"))
        try:
            daemon.start()
            for workload, n in sizes.items():
                for size in (n, 4 * n):
                    _child(["--build", socket, workload, str(size)])
                points = [(size, mode) for size in (n, 4 * n)
                          for mode in (MODES if size == n else MEMORY_MODES)]
                runs: dict[tuple[int, str], list[dict[str, Any]]] = {p: [] for p in points}
                for _ in range(repeat):  # round robin: other load hits every mode alike
                    for size, mode in points:
                        run = _child(["--measure", socket, workload, str(size), mode,
                                      str(daemon.pid)])
                        if run:
                            print(json.dumps(run), file=sys.stderr)
                            runs[size, mode].append(run)
                for point_runs in runs.values():  # the fastest run; the least CPU over all runs
                    best = dict(max(point_runs, key=lambda r: r["elements_per_s"]))
                    best["cpu_us_per_element"] = min(r["cpu_us_per_element"] for r in point_runs)
                    results.append(best)
        finally:
            daemon.stop(60)
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in results):
        rows = [r for r in results if r["workload"] == workload]
        n = min(r["n"] for r in rows)
        base = next(r for r in rows if r["mode"] == "sequential" and r["n"] == n)
        lines += [f"\n**{workload}** ({n:,} and {4 * n:,} elements)\n",
                  "| mode | elements/s (1x) | vs sequential | CPU µs/element | vs sequential "
                  "| all once | peak RssAnon 1x (MB) | peak 4x (MB) | 4x / 1x |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["n"] == n):
            big = next((b for b in rows if b["mode"] == r["mode"] and b["n"] == 4 * n), None)
            peak4 = f"{big['peak_mb']:.0f}" if big else "-"
            ratio = f"{big['peak_mb'] / r['peak_mb']:.2f}" if big else "-"
            lines.append(f"| {r['mode']} | {r['elements_per_s']:,.0f} | "
                         f"{r['elements_per_s'] / base['elements_per_s']:.2f}x | "
                         f"{r['cpu_us_per_element']:.1f} | "
                         f"{r['cpu_us_per_element'] / base['cpu_us_per_element']:.2f}x | "
                         f"{'yes' if r['ok'] and (big is None or big['ok']) else 'NO'} | "
                         f"{r['peak_mb']:.0f} | {peak4} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("--build", "--measure"):
        socket, workload, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if sys.argv[1] == "--build":
            build(socket, workload, n)
        else:
            result = measure(socket, workload, n, sys.argv[5], int(sys.argv[6]))
            print("RESULT " + json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=200_000, help="small elements at 1x (0: skip)")
    parser.add_argument("--image", type=int, default=600, help="image elements at 1x (0: skip)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per point; the best counts")
    args = parser.parse_args()
    sizes = {k: v for k, v in (("small", args.small), ("image", args.image)) if v}
    print(table(run(sizes, args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
