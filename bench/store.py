"""The object-store tier: what the store moves raw, and how much of it publish and pull get.

Run from the repository root (``make bench`` runs it through ``run.py``)::

    .venv/bin/python bench/store.py                 # quick sizes (~1.5 minutes): report on stdout
    .venv/bin/python bench/store.py --full          # make bench's sizes
    .venv/bin/python bench/store.py --servers seaweedfs --out /tmp/store.json

Against a SeaweedFS server the script starts (master, volume, filer, S3 gateway on loopback,
``tests/s3.py``), and moto's server for comparison, in the same run (docs/benchmarks.md, "The
object store tier", says what each row times):

- **raw**: PUT and GET of shard-sized objects of random bytes, one at a time, from and to
  files, through boto3 as the daemon uses it and through obstore;
- **publish**: a daemon with ``--store``, a cache written with ``cc.cache`` (256 KiB elements
  of random int32): from the commit to the store state STORED;
- **pull**: a second daemon with a data dir of its own and the same ``--store`` (a cold
  node): ``cc.dataset(name)`` reading every element, and the time to the first element.

Ratios divide publish by the raw boto3 PUT and pull by the raw boto3 GET of the same store:
what the tier adds (SHA-256, fsync, the manifest, LMDB) over the client it uses. MB are
10^6 bytes. With ``--out`` the raw results go to a JSON file; ``run.py`` renders them into
the report with :func:`render_store`. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import MB, BenchDaemon, machine_facts, reproducing_command
from report import group_header

MIB = 1 << 20
#: Sizes: the raw part's objects are as large as the cache publish and pull move, which
#: cc.cache writes as one shard (its shards hold up to 1 GiB): the same multipart upload
#: (64 MiB parts, 4 in flight) and the same single GET on both sides of a ratio.
QUICK = {"objects": 2, "object_mib": 128, "cache_mib": 128}
FULL = {"objects": 4, "object_mib": 256, "cache_mib": 256}
ELEMENT_INTS = 64 * 1024  # int32 per element: 256 KiB
SERVERS = ("seaweedfs", "moto")
SERVER_NAMES = {"seaweedfs": "SeaweedFS", "moto": "moto (server mode)"}
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


def raw_boto3(server: Any, files: list[Path], out_dir: Path) -> dict[str, Any]:
    """PUT then GET every file with boto3 the way the daemon does (tier/bucket.py)."""
    from boto3.s3.transfer import TransferConfig

    from cacheserver.tier.bucket import MULTIPART_BYTES, UPLOAD_CONCURRENCY

    bucket = server.bucket().removeprefix("s3://").split("/")[0]
    client = server.client(max_pool_connections=32, s3={"addressing_style": "path"},
                           retries={"mode": "standard", "max_attempts": 3})
    config = TransferConfig(multipart_threshold=MULTIPART_BYTES,
                            multipart_chunksize=MULTIPART_BYTES,
                            max_concurrency=UPLOAD_CONCURRENCY)

    def put() -> None:
        for path in files:
            client.upload_file(str(path), bucket, f"raw/{path.name}", Config=config)

    def get() -> None:
        for path in files:
            body = client.get_object(Bucket=bucket, Key=f"raw/{path.name}")["Body"]
            with open(out_dir / path.name, "wb") as f:
                for block in body.iter_chunks(READ_BYTES):
                    f.write(block)

    return _raw_record("boto3", put, get, files, out_dir)


def raw_obstore(server: Any, files: list[Path], out_dir: Path) -> dict[str, Any]:
    """PUT then GET every file with obstore (object_store, Rust), its defaults."""
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError:
        return {"client": "obstore", "status": "unavailable",
                "error": "obstore is not installed (pip install obstore)"}
    env = server.env()
    bucket = server.bucket().removeprefix("s3://").split("/")[0]
    store = S3Store(bucket, endpoint=server.endpoint, region=env["AWS_DEFAULT_REGION"],
                    access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                    virtual_hosted_style_request=False, client_options={"allow_http": True})

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


def _raw_record(client: str, put: Callable[[], None], get: Callable[[], None],
                files: list[Path], out_dir: Path) -> dict[str, Any]:
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
    return {"client": client, "status": "ok", "bytes": total, "put_s": put_s, "get_s": get_s,
            "put_mb_per_s": total / MB / put_s, "get_mb_per_s": total / MB / get_s}


# ---------------------------------------------------------------------- publish and pull
def tier(server: Any, scratch: Path, cache_bytes: int, timeout_s: float) -> dict[str, Any]:
    """Publish a cache from one daemon and pull it into a second, cold one."""
    import tensorflow as tf

    from client import CacheClient

    url = server.bucket()
    os.environ.update(server.env())  # the daemons' credentials (child_env copies os.environ)
    n = max(1, cache_bytes // (ELEMENT_INTS * 4))
    ds = tf.data.Dataset.range(n).map(lambda i: tf.random.stateless_uniform(
        [ELEMENT_INTS], seed=tf.stack([i, 7]), minval=None, maxval=None, dtype=tf.int32))
    name = f"store-bench-{n}"
    daemons = [BenchDaemon.in_dir(scratch, role, ("--store", url, "--store-endpoint",
                                                  server.endpoint)) for role in ("a", "b")]
    record: dict[str, Any] = {"elements": n, "element_bytes": ELEMENT_INTS * 4,
                              "payload_bytes": n * ELEMENT_INTS * 4}
    try:
        a, b = (d.start() for d in daemons)
        with CacheClient(a.target) as cc:
            start = time.perf_counter()
            count = sum(1 for _ in cc.cache(ds, name))
            committed = time.perf_counter()
            info = wait_stored(cc, name, timeout_s)
            stored = time.perf_counter()
        assert count == n, f"wrote {count} of {n} elements"
        record |= {"write_s": committed - start, "publish_s": stored - committed,
                   "stored_bytes": info.store_total_bytes, "shards": info.num_shards,
                   "disk_bytes": info.disk_bytes}
        with CacheClient(b.target) as cc:
            start = time.perf_counter()
            it = iter(cc.dataset(name))
            first = next(it)
            first_s = time.perf_counter() - start
            count = 1 + sum(1 for _ in it)
            pull_s = time.perf_counter() - start
            del it
            pulled = cc.info(name)
        assert count == n and first.shape == (ELEMENT_INTS,), f"read {count} of {n} elements"
        record |= {"pull_s": pull_s, "first_element_s": first_s,
                   "pulled_state": pulled.store_state, "pulled_disk_bytes": pulled.disk_bytes}
        for key in ("publish", "pull"):
            record[f"{key}_mb_per_s"] = record["stored_bytes"] / MB / record[f"{key}_s"]
        record["status"] = "ok"
    except Exception as exc:  # say why, keep the raw numbers
        logs = " | ".join(d.log_tail(5) for d in daemons if d.proc is not None)
        record |= {"status": "error", "error": f"{type(exc).__name__}: {exc}; daemons: {logs}"}
    finally:
        for d in daemons:
            if d.proc is not None:
                d.stop()
    return record


def wait_stored(cc: Any, name: str, timeout_s: float) -> Any:
    """Poll the cache's store state every 20 ms until STORED; its CacheInfo then."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = cc.info(name)
        if info.store_state == "STORED":
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"cache {name} still {info.store_state} after {timeout_s:g} s "
                               f"({info.store_done_bytes:,} of {info.store_total_bytes:,} "
                               f"bytes; {info.store_detail})")
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
    for key in ("loadavg", "date_utc"):
        facts.pop(key, None)
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        files_dir, out_dir = scratch_root / "objects", scratch_root / "fetched"
        files_dir.mkdir()
        out_dir.mkdir()
        files = make_objects(files_dir, sizes["objects"], sizes["object_mib"] * MIB)
        for kind in args.servers:
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
                for measure in (raw_boto3, raw_obstore):
                    raw = measure(server, files, out_dir)
                    entry["raw"].append(raw)
                    progress(f"[store] {kind} raw {raw['client']}: " + (
                        f"PUT {raw['put_mb_per_s']:,.0f} MB/s, GET {raw['get_mb_per_s']:,.0f} "
                        "MB/s" if raw["status"] == "ok" else raw["error"]))
                if kind in args.tier_servers:
                    progress(f"[store] {kind}: publish and pull of {sizes['cache_mib']} MiB ...")
                    entry["tier"] = tier(server, scratch_root / f"{kind}-tier",
                                         sizes["cache_mib"] * MIB, args.timeout)
                    progress(f"[store] {kind} tier: {summary(entry['tier'])}")
                entry["status"] = "ok"
            finally:
                server.close()
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    return {"command": reproducing_command(), "quick": not args.full, "machine": facts,
            "config": sizes | {"element_bytes": ELEMENT_INTS * 4}, "servers": results,
            "wall_seconds": round(time.monotonic() - started)}


def summary(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('error')}"
    return (f"publish {record['publish_s']:.2f} s ({record['publish_mb_per_s']:,.0f} MB/s), "
            f"pull {record['pull_s']:.2f} s ({record['pull_mb_per_s']:,.0f} MB/s), first "
            f"element {record['first_element_s']:.2f} s")


# ---------------------------------------------------------------------- the report
def _raw_of(entry: dict[str, Any], client: str) -> dict[str, Any] | None:
    found = [r for r in entry.get("raw", []) if r["client"] == client and r["status"] == "ok"]
    return found[0] if found else None


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def render_store(section: dict[str, Any]) -> list[str]:
    """The report's markdown for one run of this script."""
    config = section["config"]
    lines = ["### The object store tier", ""]
    if section.get("error"):
        return [*lines, f"Not measured: {section['error']}", ""]
    lines += group_header(section, (
        f"- Raw: {config['objects']} objects of {config['object_mib']} MiB of random bytes, one "
        "at a time, file to store and back; publish and pull: a cache of "
        f"{config['cache_mib']} MiB ({config['element_bytes'] // 1024} KiB elements of random "
        "int32) written with `cc.cache`; servers on loopback, on the machine's own disk",))
    lines += ["What the store moves through each client library (MB/s of object bytes; boto3 "
              "as the daemon uses it):", "",
              "| store | client | PUT MB/s | GET MB/s |", "|---|---|---|---|"]
    for entry in section["servers"]:
        server = SERVER_NAMES.get(entry["server"], entry["server"])
        if entry.get("status") != "ok":
            lines.append(f"| {server} | - | {entry.get('error', 'not run')[:120]} | |")
            continue
        for raw in entry["raw"]:
            if raw["status"] == "ok":
                lines.append(f"| {server} | {raw['client']} | {_num(raw['put_mb_per_s'])} | "
                             f"{_num(raw['get_mb_per_s'])} |")
            else:
                lines.append(f"| {server} | {raw['client']} | {raw['status']}: "
                             f"{raw['error'][:120]} | |")
    tiers = [e for e in section["servers"] if e.get("tier")]
    if tiers:
        lines += ["", "shardcache's publish (commit to STORED) and pull (a cold daemon's "
                  "`cc.dataset` reading every element), MB/s of the bytes stored; ratios to "
                  "the raw boto3 PUT and GET of the same store:", "",
                  "| store | cache MB (shards) | publish s | publish MB/s | vs raw PUT | "
                  "pull s | pull MB/s | vs raw GET | first element s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for entry in tiers:
            server = SERVER_NAMES.get(entry["server"], entry["server"])
            t, raw = entry["tier"], _raw_of(entry, "boto3")
            if t.get("status") != "ok":
                lines.append(f"| {server} | {t.get('status')}: {t.get('error', '')[:200]} "
                             "| | | | | | | |")
                continue
            put_ratio = t["publish_mb_per_s"] / raw["put_mb_per_s"] if raw else None
            get_ratio = t["pull_mb_per_s"] / raw["get_mb_per_s"] if raw else None
            lines.append(
                f"| {server} | {t['stored_bytes'] / MB:,.0f} ({t['shards']}) | "
                f"{t['publish_s']:.2f} | {_num(t['publish_mb_per_s'])} | "
                f"**{_num(put_ratio, 2)}x** | {t['pull_s']:.2f} | {_num(t['pull_mb_per_s'])} | "
                f"**{_num(get_ratio, 2)}x** | {t['first_element_s']:.2f} |")
    return [*lines, ""]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true",
                        help=f"make bench's sizes: {FULL['objects']} x {FULL['object_mib']} MiB "
                        f"raw, a {FULL['cache_mib']} MiB cache (default: {QUICK['objects']} x "
                        f"{QUICK['object_mib']} MiB, {QUICK['cache_mib']} MiB)")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS),
                        help="stores to measure raw (default: both)")
    parser.add_argument("--tier-servers", nargs="+", choices=SERVERS, default=["seaweedfs"],
                        help="stores to publish to and pull from (default: seaweedfs)")
    parser.add_argument("--out", type=Path, default=None, help="write the results (JSON) here")
    parser.add_argument("--no-report", action="store_true",
                        help="do not print the markdown report")
    parser.add_argument("--tmp-dir", type=Path, default=None,
                        help="where objects, servers and daemons keep their files")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for a publish to reach STORED")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    section = run(args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(section, indent=2) + "\n")
        progress(f"[store] results written to {args.out}")
    if not args.no_report:
        print("\n".join(render_store(section)))
    ok = [e for e in section["servers"] if e.get("status") == "ok"]
    return 0 if ok and all(e.get("tier", {}).get("status", "ok") == "ok" for e in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
