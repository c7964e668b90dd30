"""Small elements and blocks (issue 5, item 1 and cold item 2): one run, ratios.

    .venv/bin/python bench/small.py                      # small + tokens 200k, about 15 min
    .venv/bin/python bench/small.py --small 50000 --tokens 50000 --repeat 1 --no-tf  # quick

Three parts, each measured within this one run:

1. **Formats** (same code, same daemon): each workload is written twice, once
   with one element per stored value (format 1, what earlier versions wrote) and
   once in blocks (format 2, this version; ``--block-kib`` sizes, default 16, 64
   and 256 KiB), then every cache is read in fresh child processes, round robin
   over caches and read modes (``sequential``: stored order over ReadShard;
   ``shuffle``: exact global shuffle over ReadElements; ``shards``:
   shuffle="shards"). Reported: the fastest run's elements/s, the least
   client + daemon CPU µs per element over the runs (unlike wall time, it
   barely moves when other processes compete for the cores), payload/disk.
2. **tf.data** (unless ``--no-tf``): ``bench/run.py`` on the same workloads with
   ``ds.cache()``, ``cache(file)``, ``Dataset.load``, GZIP ``Dataset.load`` and
   shardcache (write-through, blocks): epoch 2 elements/s, ratios, payload/disk.
3. **Cold** (unless ``--no-cold``): ``bench/run.py --cold`` (page cache dropped
   before epoch 2) for ``cache(file)``, GZIP load and shardcache on ``tokens``
   (compressible) and ``small``.

Prints Markdown for docs/blocks.md on stdout, progress on stderr.
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
    "shuffle": {"shuffle": True, "seed": 1},
    "shards": {"shuffle": "shards", "seed": 1},
}
BATCH = 256
PREFETCH_BYTES = 64 << 20


def _env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))


def build(socket: str, workload: str, n: int, block_kib: int) -> dict[str, Any]:
    """Child: write cache '<workload>-<n>-<block_kib>' (0: format 1) as write-through does."""
    from workloads import WORKLOADS, make_source

    from client import CacheClient
    from client._transport import pb
    from client.format.blocks import BlockPacker, blocked
    from client.format.values import Compressor
    from client.tf import convert
    from client.write.stream import CacheWriter

    ds = make_source(WORKLOADS[workload], n)
    spec = ds.element_spec
    layout = convert.layout_of(spec)
    if block_kib:
        layout = blocked(layout, block_kib << 10)
    fmt = convert.BatchFormat(spec, layout)
    name = f"{workload}-{n}-{block_kib}"
    with CacheClient("unix://" + socket) as cc:
        begin = pb.WriteBegin(name=name, fingerprint=f"version:{name}",
                              layout_json=layout.to_json(), element_spec=convert.encode_spec(spec))
        writer = CacheWriter(cc._transport, begin)
        writer.begin()
        packer = BlockPacker(layout, None if block_kib else Compressor())
        for count, batch in convert.source_batches(ds, fmt, 1024):
            writer.add(*packer.add(batch, count))
        writer.add(*packer.flush())
        writer.finish()
        info = cc.info(name)
    payload = WORKLOADS[workload].dataset_bytes(n)
    return {"name": name, "disk_bytes": info.disk_bytes, "payload_per_disk":
            payload / info.disk_bytes, "block_elements": layout.block_elements}


def cpu_seconds(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(socket: str, name: str, workload: str, n: int, mode: str,
            daemon_pid: int) -> dict[str, Any]:
    """Child: one epoch of cc.dataset(name, mode).batch(256); time, CPU, checksum."""
    from workloads import WORKLOADS, expected_label_sum

    from client import CacheClient

    with CacheClient("unix://" + socket) as cc:
        ds = cc.dataset(name, prefetch_bytes=PREFETCH_BYTES, **MODES[mode]).batch(BATCH)
        for _ in ds.take(1):  # TF's machinery started untimed
            pass
        cpu = cpu_seconds() + cpu_seconds(daemon_pid)
        start = time.perf_counter()
        count = total = 0
        for _, labels in ds.as_numpy_iterator():
            count += len(labels)
            total += int(labels.sum())
        seconds = time.perf_counter() - start
        cpu = cpu_seconds() + cpu_seconds(daemon_pid) - cpu
    ok = count == n and total == expected_label_sum(WORKLOADS[workload], n)
    return {"elements_per_s": n / seconds, "cpu_us_per_element": 1e6 * cpu / n, "ok": ok}


def _child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], env=_env(), cwd=ROOT,
                         capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    raise RuntimeError(f"child {args} failed:\n{out.stderr[-3000:]}")


def formats(sizes: dict[str, int], block_kibs: list[int], repeat: int) -> list[dict[str, Any]]:
    """Part 1: format 1 vs blocks, same daemon and client code."""
    from daemons import BenchDaemon

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        socket = f"{tmp}/cs.sock"
        daemon = BenchDaemon(Path(tmp) / "data", Path(socket), Path(tmp) / "daemon.log",
                             extra_args=("--log-level", "warning"))
        try:
            daemon.start()
            for workload, n in sizes.items():
                caches = [_child(["--build", socket, workload, str(n), str(kib)])
                          for kib in [0, *block_kibs]]
                runs: dict[tuple[str, str], list[dict[str, Any]]] = {
                    (c["name"], mode): [] for c in caches for mode in MODES}
                for _ in range(repeat):  # round robin: other load hits every point alike
                    for name, mode in runs:
                        run = _child(["--measure", socket, name, workload, str(n), mode,
                                      str(daemon.pid)])
                        print(f"{name} {mode}: {run}", file=sys.stderr)
                        runs[name, mode].append(run)
                for cache in caches:
                    for mode in MODES:
                        got = runs[cache["name"], mode]
                        results.append({**cache, "workload": workload, "n": n, "mode": mode,
                                        "elements_per_s": max(r["elements_per_s"] for r in got),
                                        "cpu_us_per_element": min(r["cpu_us_per_element"]
                                                                  for r in got),
                                        "ok": all(r["ok"] for r in got)})
        finally:
            daemon.stop(60)
    return results


def formats_table(results: list[dict[str, Any]]) -> str:
    lines = ["| workload | stored as | elements/value | payload/disk | read | elements/s | "
             "vs format 1 | CPU µs/element | vs format 1 | all once |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        base = next(b for b in results if b["workload"] == r["workload"]
                    and b["mode"] == r["mode"] and b["name"].endswith("-0"))
        kib = r["name"].rsplit("-", 1)[1]
        lines.append(
            f"| {r['workload']} | {'format 1' if kib == '0' else f'blocks {kib} KiB'} | "
            f"{r['block_elements']} | {r['payload_per_disk']:.2f} | {r['mode']} | "
            f"{r['elements_per_s']:,.0f} | {r['elements_per_s'] / base['elements_per_s']:.2f}x | "
            f"{r['cpu_us_per_element']:.2f} | "
            f"{r['cpu_us_per_element'] / base['cpu_us_per_element']:.2f}x | "
            f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines)


def tf_comparison(sizes: dict[str, int], strategies: list[str], repeat: int,
                  cold: bool) -> dict[str, Any]:
    """Parts 2 and 3: bench/run.py in a child, its raw JSON back."""
    with tempfile.TemporaryDirectory(prefix="bench-small-run-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--workloads", *sizes,
               "--sizes", *(f"{w}={n}" for w, n in sizes.items()), "--strategies", *strategies,
               "--repeat", str(repeat), "--out", str(out), "--sections", "throughput",
               *(["--cold"] if cold else [])]
        print("$ " + " ".join(cmd[1:]), file=sys.stderr)
        subprocess.run(cmd, cwd=ROOT, env=_env(), check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def tf_table(raw: dict[str, Any], against: str) -> str:
    from workloads import WORKLOADS

    lines = ["| workload | strategy | epoch 2 s | epoch 2 elements/s | vs shardcache | "
             "shardcache vs it | payload/disk |", "|---|---|---|---|---|---|---|"]
    records = [r for r in raw["records"] if r["status"] == "ok"]
    for r in records:
        ours = next((o for o in records if o["workload"] == r["workload"]
                     and o["strategy"] == "shardcache"), None)
        e2 = r["epochs"][1]
        mine = ours["epochs"][1]["elements_per_s"] if ours else float("nan")
        payload = WORKLOADS[r["workload"]].dataset_bytes(r["n"])
        stored = r.get("disk_bytes") or r.get("daemon_disk_bytes")
        disk = f"{payload / stored:.2f}" if stored else "-"
        lines.append(f"| {r['workload']} | {r['strategy']} | {e2['seconds']:.2f} | "
                     f"{e2['elements_per_s']:,.0f} | {e2['elements_per_s'] / mine:.2f}x | "
                     f"{mine / e2['elements_per_s']:.2f}x | {disk} |")
    lines.append(f"\n(load average {raw['machine'].get('loadavg', '?')} at the start, "
                 f"{raw['machine'].get('loadavg_end', '?')} at the end; {against})")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("--build", "--measure"):
        a = sys.argv[2:]
        result = (build(a[0], a[1], int(a[2]), int(a[3])) if sys.argv[1] == "--build" else
                  measure(a[0], a[1], a[2], int(a[3]), a[4], int(a[5])))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=200_000, help="small elements (0: skip)")
    parser.add_argument("--tokens", type=int, default=200_000, help="tokens elements (0: skip)")
    parser.add_argument("--block-kib", type=int, nargs="+", default=[16, 64, 256],
                        help="block sizes to compare with format 1")
    parser.add_argument("--repeat", type=int, default=3, help="runs per point")
    parser.add_argument("--no-tf", action="store_true", help="skip the tf.data comparison")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold comparison")
    args = parser.parse_args()
    sizes = {k: v for k, v in (("small", args.small), ("tokens", args.tokens)) if v}
    print(f"Reproduce: `.venv/bin/python bench/small.py {' '.join(sys.argv[1:])}`; load "
          f"average at the start {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("### Format 1 vs blocks (same code, one daemon)\n")
    print(formats_table(formats(sizes, args.block_kib, args.repeat)))
    if not args.no_tf:
        print("\n### Epoch 2 against tf.data (bench/run.py, warm)\n")
        print(tf_table(tf_comparison(sizes, ["memory", "file", "save_load", "save_load_gzip",
                                             "shardcache"], args.repeat, cold=False),
                       "one measurement process per row, median of --repeat"))
    if not args.no_cold:
        print("\n### Cold epoch 2 (bench/run.py --cold: page cache dropped before it)\n")
        print(tf_table(tf_comparison(sizes, ["file", "save_load_gzip", "shardcache"],
                                     args.repeat, cold=True),
                       "one measurement process per row, median of --repeat"))
    print(f"\nLoad average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
