"""The ceilings under shardcache's read and write paths, measured in one run.

Run from the repository root::

    .venv/bin/python bench/ceilings.py [--mb 512] [--out ceilings.json]

Each row moves the same payload (``--mb`` MB of 602,112-byte image records, float32 values in
[0, 1] with a smooth component plus noise, like a normalised photo) through one layer alone,
single-threaded, so the rows bound what the full path (docs/benchmarks.md) can reach:

- ``memcpy``: one ``bytes`` copy of a record, the unit of every copy the path makes;
- ``crc32 (zlib)`` / ``crc32 (ISA-L)`` / ``zstd-1 compress`` / ``zstd decompress``: the
  per-record integrity and compression work (zstd's frame checksum included);
- ``grpc loopback read`` / ``write``: a bare Python gRPC server in another process streaming
  1 MiB messages over a unix socket (server-streaming for reads, client-streaming for
  writes), with nothing else done per message: what Python gRPC alone moves here;
- ``shardcache ReadShard`` / ``WriteCache``: the daemon streaming a committed shard's stored
  records (``cold``: right after dropping the page cache, which needs root; then warm), and
  accepting and committing them (LMDB writes plus fsync), without any decoding or TensorFlow
  on the client; ``WriteCache, same-host``: the same records written by the client itself
  into the shard file (client/write/direct.py: the store's ShardWriter, fsync), the daemon
  checking a sample and committing it (docs/writing.md "Same-host writes");
- ``shardcache direct read``: the same records read by the client itself from the shard
  files under a read lease (client/read/direct.py: the daemon's ReaderPool.read_chunks on a
  read-only mmap), warm, without decoding: what the same-host path moves before TensorFlow;
- ``file read cold``: plain sequential ``read()`` of a file of the same size after dropping
  the page cache: what the disk gives a reader that asks for sequential blocks.

Prints a markdown table (MB/s, and the ratio to ``memcpy``) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import zstandard

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT))

from daemons import BenchDaemon  # noqa: E402

from client._transport import Transport, pb  # noqa: E402
from client.format.values import crc32 as codec_crc32  # noqa: E402
from client.read.direct import DirectReads  # noqa: E402
from client.write.direct import LocalWriter  # noqa: E402
from client.write.stream import CacheWriter  # noqa: E402

MB = 1_000_000
RECORD_SHAPE = (224, 224, 3)
MESSAGE_BYTES = 1 << 20
_METHOD_READ = "/ceilings.Loopback/Read"
_METHOD_WRITE = "/ceilings.Loopback/Write"


def image_record(seed: int) -> bytes:
    """A normalised-photo-like float32 record: smooth gradients plus sensor noise."""
    rng = np.random.default_rng(seed)
    h, w, c = RECORD_SHAPE
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    smooth = 0.5 + 0.4 * np.sin(x[..., None] / (17 + seed % 5) + y[..., None] / 29
                                + np.arange(c, dtype=np.float32))
    noisy = smooth + rng.normal(0, 0.03, RECORD_SHAPE).astype(np.float32)
    return np.clip(noisy, 0, 1).astype(np.float32).tobytes()


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    """Run fn (returning bytes moved) and return (seconds, bytes)."""
    start = time.perf_counter()
    moved = fn()
    return time.perf_counter() - start, moved


def cpu_rows(records: list[bytes], total: int) -> dict[str, tuple[float, int]]:
    count = max(1, total // len(records[0]))
    compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
    frames = [compressor.compress(r) for r in records]
    decompressor = zstandard.ZstdDecompressor()

    def copy() -> int:
        return sum(len(bytes(bytearray(records[i % len(records)]))) for i in range(count))

    def crc(fn: Callable[[bytes], int]) -> Callable[[], int]:
        def run() -> int:
            for i in range(count):
                fn(records[i % len(records)])
            return count * len(records[0])
        return run

    def compress() -> int:
        for i in range(count):
            compressor.compress(records[i % len(records)])
        return count * len(records[0])

    def decompress() -> int:
        return sum(len(decompressor.decompress(frames[i % len(frames)])) for i in range(count))

    ratio = sum(map(len, records)) / sum(map(len, frames))
    print(f"zstd level 1 ratio on these records: {ratio:.3f}", file=sys.stderr)
    return {"memcpy": timed(copy), "crc32 (zlib)": timed(crc(zlib.crc32)),
            "crc32 (ISA-L, client/format/values.py)": timed(crc(codec_crc32)),
            "zstd-1 compress": timed(compress), "zstd decompress": timed(decompress)}


# ------------------------------------------------------------------ bare gRPC loopback


def serve_loopback(address: str, total: int) -> None:
    """The bare server (run in a child process): streams or swallows 1 MiB messages."""
    from concurrent import futures

    payload = os.urandom(MESSAGE_BYTES)

    def read(_request: bytes, _context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in range(max(1, total // MESSAGE_BYTES)):
            yield payload

    def write(requests: Iterator[bytes], _context: grpc.ServicerContext) -> bytes:
        return str(sum(len(r) for r in requests)).encode()

    handler = grpc.method_handlers_generic_handler("ceilings.Loopback", {
        "Read": grpc.unary_stream_rpc_method_handler(read),
        "Write": grpc.stream_unary_rpc_method_handler(write),
    })
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=(handler,), options=[
        ("grpc.max_receive_message_length", 64 << 20)])
    server.add_insecure_port(address)
    server.start()
    server.wait_for_termination()


def grpc_rows(tmp: Path, total: int) -> dict[str, tuple[float, int]]:
    address = f"unix://{tmp}/loopback.sock"
    child = subprocess.Popen([sys.executable, __file__, "--serve-loopback", address,
                              "--mb", str(total // MB)])
    try:
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 64 << 20)])
        grpc.channel_ready_future(channel).result(timeout=30)
        read = channel.unary_stream(_METHOD_READ)
        write = channel.stream_unary(_METHOD_WRITE)
        message = os.urandom(MESSAGE_BYTES)

        def reads() -> int:
            return sum(len(m) for m in read(b""))

        def writes() -> int:
            return int(write(iter([message] * max(1, total // MESSAGE_BYTES))))

        rows = {"grpc loopback read": timed(reads), "grpc loopback write": timed(writes)}
        channel.close()
        return rows
    finally:
        child.terminate()
        child.wait()


# ------------------------------------------------------------------ the daemon itself


def daemon_rows(tmp: Path, records: list[bytes], total: int) -> dict[str, tuple[float, int]]:
    daemon = BenchDaemon(tmp / "data", tmp / "daemon.sock", tmp / "daemon.log")
    target = daemon.address
    try:
        daemon.start()
        transport = Transport(target)
        # stored records as write-through stores incompressible ones: 0x00, CRC-32, body
        stored = [b"\x00" + zlib.crc32(r).to_bytes(4, "little") + r for r in records]
        count = max(1, total // len(stored[0]))

        def write() -> int:
            writer = CacheWriter(transport, pb.WriteBegin(
                name="ceiling", fingerprint="ceilings", layout_json='{"format": 1, "leaves": []}'))
            writer.begin()
            for i in range(count):
                writer.add([stored[i % len(stored)]], len(records[0]))
            writer.finish()
            return count * len(stored[0])

        def read() -> int:
            cache = transport.stub.GetCache(pb.GetCacheRequest(name="ceiling")).cache
            moved = 0
            for shard in cache.shards:
                for chunk in transport.stub.ReadShard(pb.ReadShardRequest(
                        name="ceiling", shard=shard.index)):
                    moved += len(chunk.data)
            return moved

        def read_direct() -> int:
            cache = transport.stub.GetCache(pb.GetCacheRequest(name="ceiling")).cache
            lease, _ = DirectReads(transport, True, None).lease(cache)
            assert lease is not None
            try:
                fetch = lease.fetcher(threading.Event())
                return sum(len(data) for _, _, data in fetch.stream(range(cache.num_elements)))
            finally:
                lease.close()

        def write_local() -> int:
            writer = LocalWriter(transport, pb.WriteBegin(
                name="ceiling-local", fingerprint="ceilings",
                layout_json='{"format": 1, "leaves": []}'), True, None)
            writer.begin()
            for i in range(count):
                writer.add([stored[i % len(stored)]], len(records[0]))
            writer.finish()
            transport.stub.DeleteCache(pb.DeleteCacheRequest(name="ceiling-local"))
            return count * len(stored[0])

        rows = {"shardcache WriteCache": timed(write)}
        rows["shardcache WriteCache, same-host (LocalWriter)"] = timed(write_local)
        drop_page_cache()
        rows["shardcache ReadShard cold"] = timed(read)
        rows["shardcache ReadShard"] = timed(read)  # now warm: the page cache holds the shard
        rows["shardcache direct read (lease, mmap)"] = timed(read_direct)
        transport.close()
        return rows
    finally:
        daemon.stop()


def file_read_cold(tmp: Path, records: list[bytes], total: int) -> tuple[float, int]:
    path = tmp / "plain.bin"
    with open(path, "wb") as f:
        for i in range(max(1, total // len(records[0]))):
            f.write(records[i % len(records)])
    drop_page_cache()

    def read() -> int:
        moved = 0
        with open(path, "rb", buffering=0) as f:
            while block := f.read(1 << 20):
                moved += len(block)
        return moved

    return timed(read)


def drop_page_cache() -> None:
    """Evict clean file pages (needs root), so that the next read comes from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as knob:
        knob.write("3\n")


def render(rows: dict[str, tuple[float, int]]) -> str:
    base = rows["memcpy"][1] / rows["memcpy"][0]
    lines = ["| layer (single stream) | MB/s | vs memcpy |", "|---|---|---|"]
    for name, (seconds, moved) in rows.items():
        rate = moved / seconds
        lines.append(f"| {name} | {rate / MB:,.0f} | {rate / base:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="payload per row, MB")
    parser.add_argument("--out", type=Path, help="write the raw rows as JSON here")
    parser.add_argument("--serve-loopback", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    total = args.mb * MB
    if args.serve_loopback:
        serve_loopback(args.serve_loopback, total)
        return 0
    records = [image_record(seed) for seed in range(8)]
    with tempfile.TemporaryDirectory(prefix="ceilings-") as tmp:
        rows = cpu_rows(records, total)
        rows.update(grpc_rows(Path(tmp), total))
        rows.update(daemon_rows(Path(tmp), records, total))
        rows["file read cold"] = file_read_cold(Path(tmp), records, total)
    print(f"Reproduce: `.venv/bin/python bench/ceilings.py --mb {args.mb}` "
          f"(load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())})\n")
    print(render(rows))
    if args.out:
        args.out.write_text(json.dumps({k: {"seconds": s, "bytes": b}
                                        for k, (s, b) in rows.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
