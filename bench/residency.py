"""Reproduces docs/benchmarks.md, "Caches larger than the daemon's room".

    .venv/bin/python bench/residency.py                        # both servers, default sizes
    .venv/bin/python bench/residency.py --quick --server moto  # small: checks that it works

A cache of ``--cache-size`` bytes of incompressible elements (``--element-size`` bytes of
random int32 each, with its index) in shards of about ``--shard-size`` is written through a
daemon with ``--store`` and published to an S3 server started on loopback (SeaweedFS, moto:
tests/s3.py). For each budget of ``--budgets`` (fractions of the cache's stored bytes: 0.5 is
a cache twice the room, 0.1 ten times), a fresh reader daemon with ``--max-bytes`` that budget
reads it for ``--epochs`` passes of ``cc.dataset(name, shuffle="shards").batch(--batch)``
from this process on its host (resident shards read from their files, streamed ones through
the daemon). Per epoch:

- the elements read, and whether every element came exactly once (their indices counted);
- the store GETs and bytes the reader daemon fetched for the cache (``cc.info(name)``:
  ``store_requests``, ``store_bytes_in``, ``store_streamed_bytes``), its GETs checked against
  the server's own access log (a GET of a missing key marks where the log stands);
- the epoch's time, to its last batch, and the streamed part's rate: the store bytes streamed
  in the epoch over the whole epoch's time (resident reads included: a lower bound);
- after the epoch: the daemon's RssAnon and VmRSS, and this process's RssAnon;
- the CPU seconds the epoch took of the S3 server, the reader daemon and this process (the
  reader), and of the server and this process (boto3) during the raw GET: what bounds the
  streamed rate on a machine where all three share the cores;
- from epoch 2 on, right after it: a raw boto3 GET of the objects the daemon fetched in it
  (from the access log), one at a time (concurrency 1), each into a file in 8 MiB blocks as
  the daemon's fetch does: the denominator of the streamed rate.

The report, per server and budget: store bytes per epoch / (cache - budget) (target <= 1.05;
the stream window's few shards are the excess), LRU's line (it would fetch the whole cache
each epoch: cache / (cache - budget)), streamed rate / raw GET (target >= 0.9), and the
RSS growth from epoch 2 to the last. Progress goes to stderr, the markdown tables to stdout,
raw results to ``--out`` (default bench/results/residency.json; ``--quick``:
bench/results/residency-quick.json).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import BENCH_DIR, MB, BenchDaemon, arguments, write_json
from probes import cpu_seconds, machine_facts, reproducing_command, rss_anon_kib
from scale import parse_size, process_facts
from store import READ_BYTES, start_server, wait_stored
from timing import markdown_table

from client import CacheClient
from tests.s3 import STORE_PREFIX
from tests.sharded import write_sharded
from tests.waits import wait_until

NAME = "larger"
DEFAULTS = {"cache": "2GiB", "element": "256KiB", "shard": "8MiB"}
QUICK = {"cache": "128MiB", "element": "64KiB", "shard": "512KiB"}


def progress(text: str) -> None:
    print(f"[residency] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the cache
def source(n: int, element_bytes: int) -> Any:
    """n elements (random int32 noise of element_bytes, distinct per element; its index)."""
    import tensorflow as tf

    ints = element_bytes // 4
    return tf.data.Dataset.range(n).map(
        lambda i: (
            tf.random.stateless_uniform(
                [ints], seed=tf.stack([i, 7]), minval=None, maxval=None, dtype=tf.int32
            ),
            i,
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def publish(server: Any, url: str, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Write the cache through a daemon with --store, wait until STORED, stop that daemon and
    remove its copy: the store alone holds the cache then."""
    n = max(1, args.cache_size // args.element_size)
    daemon = BenchDaemon(scratch, "pub", ("--store", url, "--store-endpoint", server.endpoint))
    daemon.start()
    try:
        with CacheClient(daemon.target) as cc:
            start = time.perf_counter()
            write_sharded(
                cc,
                source(n, args.element_size),
                NAME,
                shard_bytes=args.shard_size,
                chunk_bytes=min(args.element_size, 1 << 20),
                batch_elements=max(1, min(64, args.shard_size // args.element_size)),
            )
            written = time.perf_counter()
            info = wait_stored(cc, NAME, args.timeout)
            stored = time.perf_counter()
    finally:
        daemon.stop()
        shutil.rmtree(daemon.data_dir, ignore_errors=True)
    return {
        "elements": n,
        "element_bytes": args.element_size,
        "shards": info.num_shards,
        "stored_bytes": info.store_total_bytes,
        "write_s": written - start,
        "publish_s": stored - written,
    }


# ---------------------------------------------------------------------- the store's side
def logged_gets(server: Any, bucket: str) -> list[str]:
    """The keys of every GET of the cache's objects and manifest in the server's own log,
    once every request made so far is in it (a GET of a missing key marks the end: the
    server writes its log behind its answers)."""
    from botocore.exceptions import ClientError

    mark = f"log-mark-{uuid.uuid4().hex}"
    with contextlib.suppress(ClientError):  # NoSuchKey: the answer expected
        server.client().get_object(Bucket=bucket, Key=f"{STORE_PREFIX}/{mark}")
    wait_until(
        lambda: mark in server.requests("GET", "log-mark-", bucket=bucket),
        60,
        f"the mark {mark} in {server.kind}'s log",
    )
    return server.requests("GET", f"{NAME}/", bucket=bucket)


def cpu(pids: dict[str, int | str]) -> dict[str, float]:
    """CPU seconds so far of each named process."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def spent(before: dict[str, float], pids: dict[str, int | str]) -> dict[str, float]:
    """CPU seconds of each named process since before."""
    return {name: seconds - before[name] for name, seconds in cpu(pids).items()}


def raw_get(server: Any, bucket: str, keys: Sequence[str], out_dir: Path) -> dict[str, Any]:
    """GET each key with boto3, one at a time, into a file in 8 MiB blocks (the daemon's
    read size), as the daemon's stream window fetches a shard; bytes, seconds and the CPU
    seconds of the server and of this process."""
    client = server.client(s3={"addressing_style": "path"})
    pids: dict[str, int | str] = {"server": server.proc.pid, "client": "self"}
    total, start, cpu_before = 0, time.perf_counter(), cpu(pids)
    for i, key in enumerate(keys):
        body = client.get_object(Bucket=bucket, Key=f"{STORE_PREFIX}/{key}")["Body"]
        path = out_dir / f"raw-{i}"
        with open(path, "wb") as f:
            for block in body.iter_chunks(READ_BYTES):
                f.write(block)
                total += len(block)
        path.unlink()
    seconds = time.perf_counter() - start
    used = spent(cpu_before, pids)
    return {"bytes": total, "seconds": seconds, "mb_per_s": total / MB / seconds, "cpu_s": used}


# ---------------------------------------------------------------------- one budget
#: The reader daemon's counters for the cache before it counted anything.
ZERO = dict.fromkeys(
    ("gets", "bytes_in", "streamed", "hits", "misses", "shards", "resident_bytes"), 0
)


def counters(cc: CacheClient) -> dict[str, int]:
    """The reader daemon's store counters for the cache (zeros before it knows it)."""
    from client import CacheNotFoundError

    try:
        info = cc.info(NAME)
    except CacheNotFoundError:
        return dict(ZERO)
    return {
        "gets": info.store_requests.get("GET", 0),
        "bytes_in": info.store_bytes_in,
        "streamed": info.store_streamed_bytes,
        "hits": info.resident_reads,
        "misses": info.streamed_reads,
        "shards": info.resident_shards,
        "resident_bytes": info.resident_bytes,
    }


def read_point(
    server: Any,
    url: str,
    bucket: str,
    cache: dict[str, Any],
    fraction: float,
    scratch: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """A reader daemon with --max-bytes fraction of the cache, read for args.epochs epochs."""
    total, n = cache["stored_bytes"], cache["elements"]
    budget = int(total * fraction)
    point: dict[str, Any] = {"fraction": fraction, "budget_bytes": budget, "epochs": []}
    extra = ("--store", url, "--store-endpoint", server.endpoint, "--max-bytes", str(budget))
    daemon = BenchDaemon(scratch, f"reader-{fraction:g}", extra)
    daemon.start()
    try:
        with CacheClient(daemon.target) as cc:
            # the log from before the daemon's first lookup of the cache (cc.dataset's), and
            # its counters from zero: it started just now, and cc.info may not know the cache
            # (counted already) before the first read
            logged = len(logged_gets(server, bucket))
            ds = cc.dataset(
                NAME, shuffle="shards", seed=args.seed, parallel_shards=args.parallel_shards
            ).batch(args.batch)
            after = dict(ZERO)
            pids: dict[str, int | str] = {
                "server": server.proc.pid,
                "daemon": daemon.pid,
                "reader": "self",
            }
            for e in range(args.epochs):
                before = after
                seen = np.zeros(n, np.int64)
                cpu_before = cpu(pids)
                start = last = time.perf_counter()
                for _, index in ds:  # each iteration of ds reads the next epoch
                    np.add.at(seen, index.numpy(), 1)
                    last = time.perf_counter()
                # to the last batch: destroying tf.data's iterator may stall after it
                seconds = last - start
                used = spent(cpu_before, pids)
                after = counters(cc)
                keys = logged_gets(server, bucket)
                epoch_keys, logged = keys[logged:], len(keys)
                facts = process_facts(daemon.pid)
                row = {
                    "epoch": e + 1,
                    "elements": int(seen.sum()),
                    "exactly_once": bool((seen == 1).all()),
                    "seconds": seconds,
                    "gets": after["gets"] - before["gets"],
                    "logged_gets": len(epoch_keys),
                    "store_bytes": after["bytes_in"] - before["bytes_in"],
                    "streamed_bytes": after["streamed"] - before["streamed"],
                    "resident_shards": after["shards"],
                    "resident_bytes": after["resident_bytes"],
                    "hit_ratio": _share(
                        after["hits"] - before["hits"], after["misses"] - before["misses"]
                    ),
                    "daemon_rss_anon_kib": facts["rss_anon_kib"],
                    "daemon_vm_rss_kib": facts["vm_rss_kib"],
                    "client_rss_anon_kib": rss_anon_kib(),
                    "cpu_s": used,
                }
                row["bytes_vs_room"] = row["store_bytes"] / (total - budget)
                row["bytes_vs_cache"] = row["store_bytes"] / total
                row["streamed_mb_per_s"] = row["streamed_bytes"] / MB / seconds
                objects = [k for k in epoch_keys if k.startswith(f"{NAME}/objects/")]
                row["refetched"] = len(objects) - len(set(objects))  # fetched twice or more
                if e and objects:  # epoch 1 pulls: the raw GET beside the streamed epochs only
                    raw = raw_get(server, bucket, objects, scratch)
                    row["raw_get"] = raw
                    row["rate_vs_raw_get"] = row["streamed_mb_per_s"] / raw["mb_per_s"]
                    logged = len(logged_gets(server, bucket))  # the raw GETs are not the daemon's
                point["epochs"].append(row)
                progress(f"{server.kind} budget {fraction:g}: {_line(row)}")
        point |= summary(point["epochs"], total, budget)
        point["status"] = "ok"
    except Exception as exc:  # say why, keep the epochs measured
        point |= {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        point["log_tail"] = daemon.log_tail(10)
        progress(f"{server.kind} budget {fraction:g}: failed: {point['error'][:300]}")
    finally:
        daemon.stop()
        shutil.rmtree(daemon.data_dir, ignore_errors=True)
    return point


def _share(hits: int, misses: int) -> float:
    return hits / (hits + misses) if hits + misses else 1.0


def _line(row: dict[str, Any]) -> str:
    raw = f", {row['rate_vs_raw_get']:.2f}x raw GET" if "rate_vs_raw_get" in row else ""
    return (
        f"epoch {row['epoch']}: {row['elements']:,} elements"
        f"{'' if row['exactly_once'] else ' (NOT exactly once)'}, {row['seconds']:.2f} s, "
        f"{row['gets']} GETs ({row['logged_gets']} logged, {row['refetched']} of a shard "
        f"again), {row['store_bytes'] / MB:,.1f} MB "
        f"= {row['bytes_vs_room']:.3f}x (cache - budget), streamed "
        f"{row['streamed_mb_per_s']:,.0f} MB/s{raw}"
    )


def summary(epochs: list[dict[str, Any]], total: int, budget: int) -> dict[str, Any]:
    """Epochs 2 and later: medians and the worst, and RSS growth from epoch 2 to the last."""
    later = epochs[1:] or epochs
    rates = [r["rate_vs_raw_get"] for r in later if "rate_vs_raw_get" in r]
    return {
        "exactly_once": all(r["exactly_once"] for r in epochs),
        "gets_agree": all(r["gets"] == r["logged_gets"] for r in later),
        "bytes_vs_room": statistics.median(r["bytes_vs_room"] for r in later),
        "bytes_vs_room_max": max(r["bytes_vs_room"] for r in later),
        "lru_vs_room": total / (total - budget),
        "rate_vs_raw_get": statistics.median(rates) if rates else None,
        "daemon_rss_growth_kib": later[-1]["daemon_rss_anon_kib"] - later[0]["daemon_rss_anon_kib"],
        "client_rss_growth_kib": later[-1]["client_rss_anon_kib"] - later[0]["client_rss_anon_kib"],
    }


# ---------------------------------------------------------------------- a server
def run_server(kind: str, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, publish the cache to it, read it at every budget; stop it."""
    entry: dict[str, Any] = {"server": kind, "points": []}
    progress(f"starting {kind} ...")
    try:
        server = start_server(kind, scratch / kind)
    except Exception as exc:  # a missing or broken server: say so, measure the other
        progress(f"{kind} unavailable: {exc}")
        return entry | {"status": "unavailable", "error": str(exc)[:800]}
    try:
        url = server.bucket()
        bucket = url.removeprefix("s3://").split("/")[0]
        os.environ.update(server.env())  # the daemons' credentials (child_env copies it)
        progress(
            f"{kind}: publishing {args.cache_size / MB:,.0f} MB in shards of "
            f"{args.shard_size / MB:,.1f} MB ..."
        )
        entry["cache"] = publish(server, url, scratch, args)
        c = entry["cache"]
        progress(
            f"{kind}: {c['shards']} shards, {c['stored_bytes'] / MB:,.1f} MB stored "
            f"(write {c['write_s']:.1f} s, publish {c['publish_s']:.1f} s)"
        )
        for fraction in args.budgets:
            entry["points"].append(read_point(server, url, bucket, c, fraction, scratch, args))
        entry["status"] = "ok"
    except Exception as exc:
        entry |= {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        progress(f"{kind} failed: {entry['error'][:300]}")
    finally:
        server.close()
    return entry


# ---------------------------------------------------------------------- the report
def _mb(kib: int) -> str:
    return f"{kib * 1024 / MB:,.0f}"


def _cpu(row: dict[str, Any]) -> str:
    """An epoch's CPU seconds per process, and the raw GET's after it."""
    used = row.get("cpu_s")
    if not used:
        return "-"
    text = f"{used['server']:.2f} / {used['daemon']:.2f} / {used['reader']:.2f}"
    raw = row.get("raw_get", {}).get("cpu_s")
    return text + (f" ({raw['server']:.2f} / {raw['client']:.2f})" if raw else "")


def render(results: dict[str, Any]) -> str:
    """The summary table (one row per server and budget), then every epoch's row."""
    rows, epochs = [], []
    for entry in results["servers"]:
        cache = entry.get("cache")
        if entry.get("status") != "ok" and not entry.get("points"):
            why = f"{entry.get('status')}: {' '.join(str(entry.get('error')).split())[:120]}"
            rows.append([entry["server"], "-", why] + [""] * 5)
        for p in entry.get("points", []):
            if p.get("status") != "ok":
                failed = f"failed: {' '.join(p.get('error', '').split())[:120]}"
                rows.append([entry["server"], f"{1 / p['fraction']:.0f}x", failed] + [""] * 5)
                continue
            last = p["epochs"][-1]
            rate = p["rate_vs_raw_get"]
            rows.append(
                [
                    entry["server"],
                    f"{cache['stored_bytes'] / p['budget_bytes']:.0f}x",
                    f"{last['resident_shards']} of {cache['shards']}",
                    f"{p['bytes_vs_room']:.3f}x (max {p['bytes_vs_room_max']:.3f}x)",
                    f"{p['lru_vs_room']:.2f}x",
                    "-" if rate is None else f"{rate:.2f}x",
                    "yes" if p["exactly_once"] and p["gets_agree"] else "**no**",
                    f"{_mb(p['daemon_rss_growth_kib'])} / {_mb(p['client_rss_growth_kib'])}",
                ]
            )
            for r in p["epochs"]:
                epochs.append(
                    [
                        entry["server"],
                        f"{cache['stored_bytes'] / p['budget_bytes']:.0f}x",
                        r["epoch"],
                        f"{r['seconds']:.2f}",
                        f"{r['gets']} / {r['logged_gets']} / {r['refetched']}",
                        f"{r['store_bytes'] / MB:,.1f}",
                        f"{r['bytes_vs_room']:.3f}x",
                        f"{r['streamed_mb_per_s']:,.0f}",
                        f"{r['raw_get']['mb_per_s']:,.0f}" if "raw_get" in r else "-",
                        f"{r['hit_ratio']:.2f}",
                        _cpu(r),
                        f"{_mb(r['daemon_rss_anon_kib'])} / {_mb(r['client_rss_anon_kib'])}",
                    ]
                )
    summary_table = markdown_table(
        [
            "server",
            "cache / budget",
            "resident shards",
            "store bytes per epoch / (cache - budget)",
            "LRU would",
            "streamed rate / raw GET",
            "every element once, GETs = log",
            "RSS growth MB, daemon / client",
        ],
        rows,
    )
    epoch_table = markdown_table(
        [
            "server",
            "cache / budget",
            "epoch",
            "s",
            "GETs: daemon / log / of a shard again",
            "store MB",
            "/ (cache - budget)",
            "streamed MB/s",
            "raw GET MB/s",
            "hit ratio",
            "CPU s: server / daemon / reader (raw GET: server / boto3)",
            "RssAnon MB, daemon / client",
        ],
        epochs,
    )
    c = results["config"]
    head = (
        f"A cache of {c['cache_bytes'] / MB:,.0f} MB ({c['element_bytes'] // 1024} KiB "
        f"elements, shards of {c['shard_bytes'] / MB:,.1f} MB), {c['epochs']} epochs of "
        f'`shuffle="shards"`, batch {c["batch"]}; epochs 2 and later (medians; RSS growth '
        "from epoch 2 to the last):"
    )
    return f"{head}\n\n{summary_table}\n\nEvery epoch:\n\n{epoch_table}"


# ---------------------------------------------------------------------- main
def parse_fractions(text: str) -> list[float]:
    try:
        values = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"budgets {text!r}: fractions of the cache between 0 and 1, e.g. 0.5,0.1"
        )
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__)
    parser.add_argument(
        "--server",
        choices=("seaweedfs", "moto", "both"),
        default="both",
        help="the S3 server(s) to measure against (default both)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that it works")
    for flag, key, what in (
        ("--cache-size", "cache", "the cache's size"),
        ("--element-size", "element", "each element's bytes"),
        ("--shard-size", "shard", "shard_bytes the cache is written with"),
    ):
        parser.add_argument(
            flag,
            type=parse_size,
            default=None,
            help=f"{what} (default {DEFAULTS[key]}; --quick {QUICK[key]})",
        )
    parser.add_argument(
        "--budgets",
        type=parse_fractions,
        default=[0.5, 0.1],
        help="reader daemons' --max-bytes, as fractions of the cache's stored bytes "
        "(default 0.5,0.1: a cache twice and ten times the room)",
    )
    parser.add_argument("--epochs", type=int, default=4, help="epochs per budget (default 4)")
    parser.add_argument("--batch", type=int, default=32, help="elements per batch (default 32)")
    parser.add_argument("--seed", type=int, default=1, help="the shuffle's seed (default 1)")
    parser.add_argument(
        "--parallel-shards",
        type=int,
        default=0,
        help="cc.dataset's parallel_shards (default 0: tf.data's AUTOTUNE picks)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the publish (default 600)"
    )
    parser.add_argument("--tmp-dir", type=Path, help="where servers and daemons keep their data")
    parser.add_argument(
        "--out",
        type=Path,
        help="raw results (default bench/results/residency.json; --quick: "
        "bench/results/residency-quick.json)",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULTS
    for attr, key in (
        ("cache_size", "cache"),
        ("element_size", "element"),
        ("shard_size", "shard"),
    ):
        if getattr(args, attr) is None:
            setattr(args, attr, parse_size(sizes[key]))
    if args.element_size < 4 or args.element_size > args.shard_size:
        parser.error("--element-size must be at least 4 bytes and at most --shard-size")
    if args.cache_size < 4 * args.shard_size:
        parser.error("--cache-size must hold several shards (at least 4 x --shard-size)")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (epoch 1 pulls; the stream is measured after)")
    if args.out is None:
        args.out = (
            BENCH_DIR / "results" / ("residency-quick.json" if args.quick else "residency.json")
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="residency-", dir=args.tmp_dir))
    results: dict[str, Any] = {
        "command": reproducing_command(),
        "quick": args.quick,
        "machine": machine_facts(scratch),
        "config": {
            "cache_bytes": args.cache_size,
            "element_bytes": args.element_size,
            "shard_bytes": args.shard_size,
            "budgets": args.budgets,
            "epochs": args.epochs,
            "batch": args.batch,
            "parallel_shards": args.parallel_shards,
            "raw_get_concurrency": 1,
        },
        "servers": [],
    }
    started = time.monotonic()
    try:
        kinds = ("seaweedfs", "moto") if args.server == "both" else (args.server,)
        for kind in kinds:
            results["servers"].append(run_server(kind, scratch, args))
            write_json(args.out, results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        results["wall_seconds"] = round(time.monotonic() - started)
        write_json(args.out, results)
    print(render(results))
    ok = [e for e in results["servers"] if e.get("status") == "ok"]
    return 0 if ok and all(p.get("status") == "ok" for e in ok for p in e["points"]) else 1


if __name__ == "__main__":
    sys.exit(main())
