"""Reproduces docs/benchmarks.md, "The object store tier" (run.py's store section runs it).

The object store tier: what a store moves raw, and how much of it publish and pull get.

    .venv/bin/python bench/store.py            # quick sizes (~1.5 minutes); --full: make bench's

Against a SeaweedFS server it starts on loopback (``tests/s3.py``), then moto's: raw PUT and
GET through boto3 (as the daemon uses it) and obstore; a cache's publish (commit to STORED)
and its pulls into a second, cold daemon, each pull right after a raw boto3 GET of the same
store, as ratios to the raw boto3 PUT and GET (docs/benchmarks.md, "The object store tier").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import MB, BenchDaemon, arguments, write_json
from probes import machine_facts, reproducing_command
from report import render_store

MIB = 1 << 20
#: Sizes: the raw part's objects are as large as the cache publish and pull move, which
#: cc.cache writes as one shard (its shards hold up to 1 GiB): the same multipart upload
#: (64 MiB parts, 4 in flight) and the same single GET on both sides of a ratio.
QUICK = {"objects": 2, "object_mib": 128, "cache_mib": 128}
FULL = {"objects": 4, "object_mib": 256, "cache_mib": 256}
ELEMENT_INTS = 64 * 1024  # int32 per element: 256 KiB
READ_BYTES = 8 << 20  # the daemon's download read size (cacheserver/tier/bucket.py)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- raw PUT and GET
def make_objects(directory: Path, count: int, size: int) -> list[Path]:
    """``count`` files of ``size`` random bytes (incompressible, as float noise nearly is)."""
    files = []
    for i in range(count):
        path = directory / f"object-{i}"
        with open(path, "wb") as f:
            for _ in range(0, size, 4 * MIB):
                f.write(os.urandom(min(4 * MIB, size - f.tell())))
        files.append(path)
    return files


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def raw_boto3(
    server: Any, files: list[Path], out_dir: Path
) -> tuple[dict[str, Any], Callable[[], float]]:
    """PUT then GET every file with boto3: ``upload_file`` as the daemon publishes, and one
    ``get_object`` per object streamed to a file. The record, and the GET again (MB/s)."""
    from boto3.s3.transfer import TransferConfig

    from cacheserver.tier.bucket import MULTIPART_BYTES, UPLOAD_CONCURRENCY

    bucket = server.bucket().removeprefix("s3://").split("/")[0]
    client = server.client(
        max_pool_connections=32,
        s3={"addressing_style": "path"},
        retries={"mode": "standard", "max_attempts": 3},
    )
    config = TransferConfig(
        multipart_threshold=MULTIPART_BYTES,
        multipart_chunksize=MULTIPART_BYTES,
        max_concurrency=UPLOAD_CONCURRENCY,
    )

    def put() -> None:
        for path in files:
            client.upload_file(str(path), bucket, f"raw/{path.name}", Config=config)

    def get() -> None:
        for path in files:
            body = client.get_object(Bucket=bucket, Key=f"raw/{path.name}")["Body"]
            with open(out_dir / path.name, "wb") as f:
                for block in body.iter_chunks(READ_BYTES):
                    f.write(block)

    def get_again() -> float:
        seconds = timed(get)
        total = 0
        for path in files:
            total += (out_dir / path.name).stat().st_size
            (out_dir / path.name).unlink()
        return total / MB / seconds

    return _raw_record("boto3", put, get, files, out_dir), get_again


def raw_obstore(server: Any, files: list[Path], out_dir: Path) -> dict[str, Any]:
    """PUT then GET every file with obstore (object_store, Rust), its defaults."""
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError:
        return {
            "client": "obstore",
            "status": "unavailable",
            "error": "obstore is not installed (pip install obstore)",
        }
    env = server.env()
    bucket = server.bucket().removeprefix("s3://").split("/")[0]
    store = S3Store(
        bucket,
        endpoint=server.endpoint,
        region=env["AWS_DEFAULT_REGION"],
        access_key_id=env["AWS_ACCESS_KEY_ID"],
        secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )

    def put() -> None:
        for path in files:
            obstore.put(store, f"raw/{path.name}", path)

    def get() -> None:
        for path in files:
            result = obstore.get(store, f"raw/{path.name}")
            with open(out_dir / path.name, "wb") as f:
                for block in result.stream(min_chunk_size=READ_BYTES):
                    f.write(block)

    return _raw_record("obstore", put, get, files, out_dir)


def _raw_record(
    client: str, put: Callable[[], None], get: Callable[[], None], files: list[Path], out_dir: Path
) -> dict[str, Any]:
    total = sum(p.stat().st_size for p in files)
    try:
        put_s = timed(put)
        get_s = timed(get)
    except Exception as exc:  # one client failing must not stop the others
        return {"client": client, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
    for path in files:  # every byte came back
        if (out_dir / path.name).read_bytes() != path.read_bytes():
            return {"client": client, "status": "error", "error": f"{path.name} differs"}
        (out_dir / path.name).unlink()
    return {
        "client": client,
        "status": "ok",
        "bytes": total,
        "put_s": put_s,
        "get_s": get_s,
        "put_mb_per_s": total / MB / put_s,
        "get_mb_per_s": total / MB / get_s,
    }


# ---------------------------------------------------------------------- publish and pull
def tier(
    server: Any,
    scratch: Path,
    cache_bytes: int,
    timeout_s: float,
    rounds: int,
    raw_get: Callable[[], float],
) -> dict[str, Any]:
    """Publish a cache from one daemon, then pull it into a second, cold one ``rounds`` times
    (its local copy deleted between), each pull right after a raw GET (``raw_get``) of the same
    store: pull and raw GET interleaved, so that a ratio compares neighbours."""
    import tensorflow as tf

    from client import CacheClient

    url = server.bucket()
    os.environ.update(server.env())  # the daemons' credentials (child_env copies os.environ)
    n = max(1, cache_bytes // (ELEMENT_INTS * 4))
    ds = tf.data.Dataset.range(n).map(
        lambda i: tf.random.stateless_uniform(
            [ELEMENT_INTS], seed=tf.stack([i, 7]), minval=None, maxval=None, dtype=tf.int32
        )
    )
    name = f"store-bench-{n}"
    daemons = [
        BenchDaemon(scratch, role, ("--store", url, "--store-endpoint", server.endpoint))
        for role in ("a", "b")
    ]
    record: dict[str, Any] = {
        "elements": n,
        "element_bytes": ELEMENT_INTS * 4,
        "payload_bytes": n * ELEMENT_INTS * 4,
        "rounds": [],
    }
    try:
        a, b = (d.start() for d in daemons)
        with CacheClient(a.target) as cc:
            start = time.perf_counter()
            count = sum(1 for _ in cc.cache(ds, name))
            committed = time.perf_counter()
            info = wait_stored(cc, name, timeout_s)
            stored = time.perf_counter()
        assert count == n, f"wrote {count} of {n} elements"
        record |= {
            "write_s": committed - start,
            "publish_s": stored - committed,
            "stored_bytes": info.store_total_bytes,
            "shards": info.num_shards,
            "disk_bytes": info.disk_bytes,
        }
        for i in range(rounds):
            get_s = raw_get()
            with CacheClient(b.target) as cc:
                if i:
                    cc.delete(name)  # this daemon's copy only: the next read pulls again
                pulled = pull_once(cc, name, n, timeout_s)
            record["rounds"].append(pulled | {"raw_get_mb_per_s": get_s})
        for key in ("pull_s", "to_disk_s", "first_element_s"):
            record[key] = statistics.median([r[key] for r in record["rounds"]])
        for key in ("publish", "pull", "to_disk"):
            record[f"{key}_mb_per_s"] = record["stored_bytes"] / MB / record[f"{key}_s"]
        for key in ("pull", "to_disk"):  # the median of the rounds' ratios to their raw GET
            record[f"{key}_vs_raw_get"] = statistics.median(
                [
                    record["stored_bytes"] / MB / r[f"{key}_s"] / r["raw_get_mb_per_s"]
                    for r in record["rounds"]
                ]
            )
        record["status"] = "ok"
    except Exception as exc:  # say why, keep the raw numbers
        logs = " | ".join(d.log_tail(5) for d in daemons if d.proc is not None)
        record |= {"status": "error", "error": f"{type(exc).__name__}: {exc}; daemons: {logs}"}
    finally:
        for d in daemons:
            if d.proc is not None:
                d.stop()
    return record


def pull_once(cc: Any, name: str, n: int, timeout_s: float) -> dict[str, Any]:
    """Read every element of name on a daemon that lacks it: the times from ``cc.dataset``
    to its first and its last element, and the pull to disk: from ``iter`` (the read's first
    call, which starts the pull; the dataset built and the name looked up before) to the
    store state STORED (every shard fetched, checked, synced and in place), seen by a thread
    polling every 5 ms."""
    stored_at: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            if cc.info(name).store_state == "STORED":
                stored_at.append(time.perf_counter())
                return
            stop.wait(0.005)

    start = time.perf_counter()
    ds = cc.dataset(name)
    pulling = time.perf_counter()
    it = iter(ds)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    first = next(it)
    first_s = time.perf_counter() - start
    count = 1 + sum(1 for _ in it)
    pull_s = time.perf_counter() - start
    del it
    poller.join(timeout_s)
    stop.set()
    assert count == n and first.shape == (ELEMENT_INTS,), f"read {count} of {n} elements"
    assert stored_at, f"cache {name} not STORED after {timeout_s:g} s"
    return {"pull_s": pull_s, "first_element_s": first_s, "to_disk_s": stored_at[0] - pulling}


def wait_stored(cc: Any, name: str, timeout_s: float) -> Any:
    """Poll the cache's store state every 20 ms until STORED; its CacheInfo then."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = cc.info(name)
        if info.store_state == "STORED":
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"cache {name} still {info.store_state} after {timeout_s:g} s "
                f"({info.store_done_bytes:,} of {info.store_total_bytes:,} "
                f"bytes; {info.store_detail})"
            )
        time.sleep(0.02)


# ---------------------------------------------------------------------- the run
def start_server(kind: str, workdir: Path) -> Any:
    from tests.s3 import MotoServer, SeaweedFS

    if kind == "moto":
        return MotoServer(workdir).start()
    return SeaweedFS(workdir, volume_mb=256).start()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every server; return the section as one JSON-able object."""
    sizes = FULL if args.full else QUICK
    scratch_root = Path(tempfile.mkdtemp(prefix="shardcache-store-bench-", dir=args.tmp_dir))
    facts = machine_facts(scratch_root)
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        files_dir, out_dir = scratch_root / "objects", scratch_root / "fetched"
        files_dir.mkdir()
        out_dir.mkdir()
        files = make_objects(files_dir, sizes["objects"], sizes["object_mib"] * MIB)
        for kind in ("seaweedfs", "moto"):
            entry: dict[str, Any] = {"server": kind, "raw": []}
            results.append(entry)
            progress(f"[store] starting {kind} ...")
            try:
                server = start_server(kind, scratch_root / kind)
            except Exception as exc:  # a missing or broken server: say so, measure the rest
                entry |= {"status": "unavailable", "error": str(exc)[:800]}
                progress(f"[store] {kind} unavailable: {exc}")
                continue
            try:
                boto3, get_again = raw_boto3(server, files, out_dir)
                for raw in (boto3, raw_obstore(server, files, out_dir)):
                    entry["raw"].append(raw)
                    progress(
                        f"[store] {kind} raw {raw['client']}: "
                        + (
                            f"PUT {raw['put_mb_per_s']:,.0f} MB/s, GET {raw['get_mb_per_s']:,.0f} "
                            "MB/s"
                            if raw["status"] == "ok"
                            else raw["error"]
                        )
                    )
                progress(
                    f"[store] {kind}: publish of {sizes['cache_mib']} MiB, {args.rounds} "
                    "pulls, each after a raw GET ..."
                )
                entry["tier"] = tier(
                    server,
                    scratch_root / f"{kind}-tier",
                    sizes["cache_mib"] * MIB,
                    args.timeout,
                    args.rounds,
                    get_again,
                )
                progress(f"[store] {kind} tier: {summary(entry['tier'])}")
                entry["status"] = "ok"
            finally:
                server.close()
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    return {
        "command": reproducing_command(),
        "quick": not args.full,
        "machine": facts,
        "config": sizes | {"element_bytes": ELEMENT_INTS * 4},
        "servers": results,
        "wall_seconds": round(time.monotonic() - started),
    }


def summary(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('error')}"
    return (
        f"publish {record['publish_s']:.2f} s ({record['publish_mb_per_s']:,.0f} MB/s), "
        f"pull to disk {record['to_disk_s']:.2f} s ({record['to_disk_vs_raw_get']:.2f}x "
        f"raw GET), pull and read {record['pull_s']:.2f} s ({record['pull_vs_raw_get']:.2f}x)"
        f", first element {record['first_element_s']:.2f} s; rounds: "
        + ", ".join(
            f"{r['to_disk_s']:.2f}/{record['stored_bytes'] / MB / r['raw_get_mb_per_s']:.2f}"
            for r in record["rounds"]
        )
        + " s (pull to disk/raw GET)"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__, out=True)
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"{FULL['objects']} x {FULL['object_mib']} MiB raw, a "
        f"{FULL['cache_mib']} MiB cache (default: {QUICK['objects']} x "
        f"{QUICK['object_mib']} MiB, {QUICK['cache_mib']} MiB)",
    )
    parser.add_argument("--no-report", action="store_true", help="print no markdown")
    parser.add_argument("--tmp-dir", type=Path, help="where objects, servers and daemons go")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="pulls per store, each after a raw GET; medians are reported",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for a publish to reach STORED"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    section = run(args)
    write_json(args.out, section)
    if not args.no_report:
        print("\n".join(render_store(section)))
    ok = [e for e in section["servers"] if e.get("status") == "ok"]
    return 0 if ok and all(e.get("tier", {}).get("status", "ok") == "ok" for e in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
