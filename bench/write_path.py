"""Epoch 1 only: the bare pipeline vs the ways of caching it, as ratios to bare, in one run.

Run from the repository root::

    .venv/bin/python bench/write_path.py --workload jpeg --n 600 --repeat 3
    .venv/bin/python bench/write_path.py --workload image --n 1000 \\
        --strategies none memory file shardcache --baseline-root ../wt-base

Strategies (epoch 1 of each, batch 256 after the cache op, as ``run.py``):
``none`` (the bare pipeline), ``memory`` (``ds.cache()``), ``file``
(``ds.cache(filename)``), ``save`` (``Dataset.save``), ``shardcache``
(``CacheClient.cache`` write-through, committed before the clock stops; on
this host it writes the shard files itself: same-host writes, docs/writing.md),
``shardcache-grpc`` (the same with ``direct=False``: chunks streamed over gRPC).
Named only: ``shardcache-generator`` (``shardcache`` through the generator
path, ``SHARDCACHE_WRITE_TAP=0``: the source's batches through Python and
``from_generator``, as before the tap, docs/writing.md) and ``passthrough``
(the tapped write epoch's dataset with nothing written, as when the daemon is
down: the source's ``batch(256)`` inside the control ``flat_map``, malloc
tuned as a CacheClient epoch tunes it).
``--pipeline-threads N`` runs the source's map on a private pool of N threads
(``tf.data.Options.threading``, one intra-op thread each) instead of all cores:
with N = 1 the pipeline leaves one core of this 2-core machine to everything
else, which shows what write-through costs when its work can overlap with the
pipeline's rather than compete with it (docs/writing.md).
``--baseline-root DIR`` adds ``shardcache@base``: the same, with the client
and the daemon imported from another checkout (A/B of a change in one run).

``--layers`` measures the write path's layers instead, on synthetic 602 KB
float32 records without TensorFlow (``ceilings.py``'s records): per layer the
wall MB/s and the CPU seconds per GB of the client and the daemon, for this
checkout and (with ``--baseline-root``) the other one, alternating:
``encode+pack`` (codec: records from a stacked batch, CRC, stored values),
``WriteCache`` (those values through CacheWriter to a daemon, committed), and
``LMDB append, in-process`` (store.ShardWriter appending the same values and
committing with fsync: what a same-host write path without gRPC would pay) and
``WriteCache, same-host`` (the values through client/write/direct.py's
LocalWriter: the client writes the shard file, the daemon checks and commits it).

Every measurement runs in its own process (TensorFlow imported, two batches
of zeros iterated untimed, ``sync``), round-robin over the strategies for
each repeat, so that a noisy neighbour hits all of them alike; a row's ratio
is the median over repeats of (its time / bare's time in the same repeat).
Peak RssAnon is the process's over the epoch; client and daemon CPU seconds
are summed over all their threads. Prints markdown on stdout, progress on
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daemons import BenchDaemon

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
STRATEGIES = ("none", "memory", "file", "save", "shardcache", "shardcache-grpc")
#: Not run unless named: where the write epoch's element path costs go.
EXTRA_STRATEGIES = ("shardcache-generator", "passthrough")
RESULT = "RESULT "
MB = 1_000_000


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One epoch 1 of one strategy in this process."""
    sys.path.insert(0, str(BENCH_DIR))
    from measure import RssSampler, kib_to_mb
    from strategies import timed_iteration
    from workloads import WORKLOADS, expected_label_sum, make_source, make_warmup

    sampler = RssSampler().start()
    workload = WORKLOADS[args.workload]
    timed_iteration(make_warmup(workload, min(2 * 256, args.n)).batch(256))
    src = make_source(workload, args.n)
    if args.pipeline_threads:
        import tensorflow as tf

        options = tf.data.Options()
        options.threading.private_threadpool_size = args.pipeline_threads
        options.threading.max_intra_op_parallelism = 1
        src = src.with_options(options)
    tmp = Path(args.tmp_dir)
    keep: list[Any] = []
    strategy = args.strategy.split("@")[0]
    if strategy == "none":
        ds = src.batch(256)
    elif strategy == "memory":
        ds = src.cache().batch(256)
    elif strategy == "file":
        ds = src.cache(str(tmp / "cache")).batch(256)
    elif strategy in ("shardcache", "shardcache-grpc", "shardcache-generator"):
        from client import CacheClient

        if strategy == "shardcache-generator":
            os.environ["SHARDCACHE_WRITE_TAP"] = "0"
        cc = CacheClient("unix://" + args.socket)
        keep.append(cc)
        direct = False if strategy == "shardcache-grpc" else None
        ds = cc.cache(src, name=args.cache_name, direct=direct).batch(256)
    elif strategy == "passthrough":
        from client.tf import convert, malloc, tap

        def source_only() -> tap.Decision:  # as CacheClient._begin_epoch with the daemon down
            malloc.tune()
            return tap.Decision(tap.SOURCE)

        fmt = convert.BatchFormat(src.element_spec, convert.layout_of(src.element_spec))
        taps = tap.TapEpochs(fmt.layout, source_only, args.n)
        ds = convert.tapped_batches(src, fmt, taps, 256)
    os.sync()
    sampler.reset_window()
    before = resource.getrusage(resource.RUSAGE_SELF)
    daemon_before = _cpu_of(args.daemon_pid) if args.daemon_pid else 0.0
    if strategy == "save":
        start = time.perf_counter()
        src.save(str(tmp / "saved"))
        seconds, elements, label_sum = time.perf_counter() - start, args.n, None
    else:
        result = timed_iteration(ds)
        seconds, elements, label_sum = result.seconds, result.elements, result.label_sum
    after = resource.getrusage(resource.RUSAGE_SELF)
    record: dict[str, Any] = {
        "strategy": args.strategy, "seconds": seconds,
        "ok": elements == args.n and label_sum in (None, expected_label_sum(workload, args.n)),
        "client_cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "daemon_cpu": (_cpu_of(args.daemon_pid) - daemon_before) if args.daemon_pid else 0.0,
        "peak_rss_anon_mb": kib_to_mb(sampler.window_anon_kib),
        "payload_mb": workload.dataset_bytes(args.n) / MB,
    }
    if strategy.startswith("shardcache"):
        info = keep[0].info(args.cache_name)
        record["committed"] = info.state == "READY" and info.num_elements == args.n
        keep[0].delete(args.cache_name)
        keep[0].close()
    sampler.stop()
    return record


def child_layers(args: argparse.Namespace) -> dict[str, Any]:
    """The write path's layers, each timed on the same records (one process)."""
    sys.path.insert(0, str(BENCH_DIR))
    import numpy as np
    from ceilings import RECORD_SHAPE, image_record

    from client._transport import Transport, pb
    from client.format.codec import encode_batch
    from client.write.stream import CacheWriter

    try:
        from client.format.layout import Layout, Leaf
        from client.format.values import Compressor
    except ImportError:  # --baseline-root: a checkout from before the codec split (697db04)
        from client.format.codec import Compressor, Layout, Leaf  # type: ignore[attr-defined,no-redef]

    records = [image_record(seed) for seed in range(16)]
    batch = np.stack([np.frombuffer(r, np.float32).reshape(RECORD_SHAPE) for r in records[:6]])
    layout = Layout((Leaf("float32", RECORD_SHAPE),))
    count = max(6, args.mb * MB // len(records[0]) // 6 * 6)
    rows: dict[str, Any] = {}

    def measure(name: str, fn: Any) -> Any:
        before = resource.getrusage(resource.RUSAGE_SELF)
        daemon_before = _cpu_of(args.daemon_pid) if args.daemon_pid else 0.0
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        gb = count * len(records[0]) / 1e9
        rows[name] = {
            "mb_per_s": gb * 1000 / seconds,
            "client_cpu_per_gb": (after.ru_utime + after.ru_stime - before.ru_utime
                                  - before.ru_stime) / gb,
            "daemon_cpu_per_gb": ((_cpu_of(args.daemon_pid) - daemon_before) / gb
                                  if args.daemon_pid and name.startswith("WriteCache")
                                  else 0.0)}
        return out

    compressor = Compressor()
    for _ in range(Compressor.GIVE_UP):  # past the probes, as in a long epoch
        compressor.pack(records[0])

    def encode() -> list[Any]:
        values: list[Any] = []
        for _ in range(count // 6):
            values = [compressor.pack(b) for b in encode_batch(layout, [batch], 6)]
        return values

    values = measure("encode+pack", encode)
    transport = Transport("unix://" + args.socket)

    def write() -> None:
        writer = CacheWriter(transport, pb.WriteBegin(
            name=args.cache_name, fingerprint="write_path", layout_json=layout.to_json()))
        writer.begin()
        for _ in range(count // 6):
            writer.add(values, 6 * len(records[0]))
        writer.finish()

    measure("WriteCache", write)
    transport.stub.DeleteCache(pb.DeleteCacheRequest(name=args.cache_name))
    try:
        from client.write.direct import LocalWriter
    except ImportError:  # a checkout from before same-host writes
        LocalWriter = None

    def write_local() -> None:
        assert LocalWriter is not None
        writer = LocalWriter(transport, pb.WriteBegin(
            name=args.cache_name, fingerprint="write_path", layout_json=layout.to_json()),
            True, None)
        writer.begin()
        for _ in range(count // 6):
            writer.add(values, 6 * len(records[0]))
        writer.finish()

    if LocalWriter is not None:
        measure("WriteCache, same-host", write_local)
        transport.stub.DeleteCache(pb.DeleteCacheRequest(name=args.cache_name))
    transport.close()
    from client.format.store import ShardWriter

    def direct() -> None:
        shard = ShardWriter(Path(args.tmp_dir) / "direct", count * len(values[0]))
        for _ in range(count // 6):
            shard.append(values, 6 * len(records[0]))
        shard.commit()

    measure("LMDB append, in-process", direct)
    return {"rows": rows}


def _layers(args: argparse.Namespace, scratch: Path, daemons: dict[str, BenchDaemon]) -> str:
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in daemons}
    for repeat in range(args.repeat):
        for label, daemon in daemons.items():
            tmp = Path(tempfile.mkdtemp(dir=scratch))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child-layers",
                   "--mb", str(args.mb), "--tmp-dir", str(tmp),
                   "--socket", str(daemon.socket_path), "--daemon-pid", str(daemon.pid),
                   "--cache-name", f"layers-{repeat}"]
            env = dict(os.environ, PYTHONPATH=str(daemon.root))
            out = subprocess.run(cmd, cwd=daemon.root, env=env, capture_output=True, text=True,
                                 timeout=args.timeout, check=False)
            shutil.rmtree(tmp, ignore_errors=True)
            lines = [x for x in out.stdout.splitlines() if x.startswith(RESULT)]
            if not lines:
                raise RuntimeError(f"layers ({label}) failed: {out.stderr[-2000:]}")
            results[label].append(json.loads(lines[0][len(RESULT):])["rows"])
            print(f"{repeat} {label}: done", file=sys.stderr)
    table = [f"{args.mb} MB of 602 KB float32 records per layer, {args.repeat} repeat(s), "
             "medians", "",
             "| checkout | layer | MB/s | client CPU s/GB | daemon CPU s/GB |",
             "|---|---|---|---|---|"]
    for label, runs in results.items():
        for layer in runs[0]:
            def med(key: str, layer: str = layer, runs: list[Any] = runs) -> float:
                return statistics.median(r[layer][key] for r in runs)
            table.append(f"| {label} | {layer} | {med('mb_per_s'):,.0f} | "
                         f"{med('client_cpu_per_gb'):.2f} | {med('daemon_cpu_per_gb'):.2f} |")
    return "\n".join(table)


def _daemon(root: Path, scratch: Path, label: str) -> BenchDaemon:
    """A started daemon running ``root``'s cacheserver (this checkout or a baseline's)."""
    from daemons import BenchDaemon

    daemon = BenchDaemon(scratch / f"data-{label}", scratch / f"{label}.sock",
                         scratch / f"{label}.log", root=root)
    return daemon.start(60)  # type: ignore[return-value]


def _measure(args: argparse.Namespace, strategy: str, scratch: Path,
             daemons: dict[str, BenchDaemon], repeat: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"{strategy}-", dir=scratch))
    daemon = daemons.get(strategy)
    root = daemon.root if daemon else REPO_ROOT
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--workload", args.workload,
           "--n", str(args.n), "--pipeline-threads", str(args.pipeline_threads),
           "--strategy", strategy, "--tmp-dir", str(tmp),
           "--cache-name", f"write-path-{repeat}"]
    if daemon is not None:
        cmd += ["--socket", str(daemon.socket_path), "--daemon-pid", str(daemon.pid)]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                         timeout=args.timeout, check=False)
    shutil.rmtree(tmp, ignore_errors=True)
    for line in out.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])  # type: ignore[no-any-return]
    raise RuntimeError(f"{strategy} failed (exit {out.returncode}): {out.stderr[-2000:]}")


def _table(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    bare = [r["seconds"] for r in runs["none"]]
    bare_cpu = statistics.median(r["client_cpu"] + r["daemon_cpu"] for r in runs["none"])
    payload = runs["none"][0]["payload_mb"]
    lines = [
        f"`{args.workload}`, {args.n:,} elements ({payload:,.0f} MB), epoch 1, "
        f"{args.repeat} repeat(s), pipeline threads: {args.pipeline_threads or 'all cores'}; "
        f"bare pipeline: {payload / statistics.median(bare):,.0f} MB/s",
        "",
        "| strategy | epoch 1 s (median, min-max) | ratio to bare (median) | MB/s | "
        "client CPU s | daemon CPU s | CPU vs bare | peak RssAnon MB | checks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for strategy, records in runs.items():
        secs = [r["seconds"] for r in records]
        cpu = statistics.median(r["client_cpu"] + r["daemon_cpu"] for r in records)
        ratios = [s / b for s, b in zip(secs, bare)]
        ok = all(r["ok"] and r.get("committed", True) for r in records)
        lines.append(
            f"| {strategy} | {statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f}) | "
            f"{statistics.median(ratios):.2f}x | {payload / statistics.median(secs):,.0f} | "
            f"{statistics.median(r['client_cpu'] for r in records):.2f} | "
            f"{statistics.median(r['daemon_cpu'] for r in records):.2f} | "
            f"{cpu / bare_cpu:.2f}x | "
            f"{max(r['peak_rss_anon_mb'] for r in records):,.0f} | {'ok' if ok else 'FAILED'} |")
    lines += [
        "",
        "CPU vs bare: the median CPU seconds (client + daemon) over the bare pipeline's.",
        "When the pipeline keeps both cores busy, an epoch costs about that ratio; the",
        "wall-clock ratio also moves with how well tf.data's autotuning fills the cores",
        "(docs/writing.md).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="jpeg")
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES),
                        choices=STRATEGIES + EXTRA_STRATEGIES)
    parser.add_argument("--baseline-root", type=Path, default=None,
                        help="another checkout: adds shardcache@base, run from its code")
    parser.add_argument("--pipeline-threads", type=int, default=0, metavar="N",
                        help="run the source's map on N threads (default 0: all cores); "
                             "1 leaves a core to the write path (see above)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--layers", action="store_true",
                        help="measure the write path's layers (see above) instead")
    parser.add_argument("--mb", type=int, default=256, help="--layers: MB per layer")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-layers", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--strategy", "--tmp-dir", "--socket", "--cache-name"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--daemon-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.child_layers:
        print(RESULT + json.dumps(child_layers(args) if args.child_layers else child(args)),
              flush=True)
        return 0
    sys.path.insert(0, str(REPO_ROOT))
    if "none" not in args.strategies:
        args.strategies.insert(0, "none")
    strategies = list(args.strategies)
    scratch = Path(tempfile.mkdtemp(prefix="wp-"))
    daemons: dict[str, BenchDaemon] = {}
    try:
        if args.layers:
            daemons["head"] = _daemon(REPO_ROOT, scratch, "head")
            if args.baseline_root is not None:
                daemons["base"] = _daemon(args.baseline_root.resolve(), scratch, "base")
            print(_layers(args, scratch, daemons))
            print(f"\nLoad average (1/5/15 min) at the end: "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            return 0
        if any(s.startswith("shardcache") for s in strategies):
            head = _daemon(REPO_ROOT, scratch, "head")
            for strategy in ("shardcache", "shardcache-grpc", "shardcache-generator"):
                daemons[strategy] = head
            if args.baseline_root is not None:
                daemons["shardcache@base"] = _daemon(args.baseline_root.resolve(), scratch,
                                                     "base")
                strategies.append("shardcache@base")
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in strategies}
        print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
        for repeat in range(args.repeat):
            for strategy in strategies:
                record = _measure(args, strategy, scratch, daemons, repeat)
                runs[strategy].append(record)
                print(f"{repeat} {strategy}: {record['seconds']:.2f} s", file=sys.stderr)
        end_load = os.getloadavg()
    finally:
        for daemon in {id(d): d for d in daemons.values()}.values():
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print(_table(args, runs))
    print(f"\nLoad average (1/5/15 min) at the end: {' '.join(f'{x:.2f}' for x in end_load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
