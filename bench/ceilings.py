"""Reproduces the ReadShard ceiling of docs/design.md, "A fleet on paper" (and benchmarks.md).

What each layer of the read and write paths moves alone.

    .venv/bin/python bench/ceilings.py [--mb 512]      # root adds the cold rows

Every row moves ``--mb`` MB of 602 KB float32 image records (smooth plus noise, like a
normalised photo): a ``memcpy``; CRC-32 (zlib, ISA-L); zstd-1 compress and decompress; a bare
Python gRPC server in another process streaming 1 MiB messages over a unix socket; a daemon's
``WriteCache`` (over gRPC, and same-host: the client writing the shard file) and
``ReadShard`` (no decoding, no TensorFlow; cold and warm); a plain file read cold. The table
gives MB/s, the ratio to ``memcpy`` and the CPU seconds per GB here and in the server.
What bulk transports move (a data plane's candidates): bench/transports.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import MB, BenchDaemon, arguments, server_process, write_json
from probes import drop_page_cache, run_line
from timing import ROW_KEYS, Row, markdown_table, per_gb, ratio, timed

RECORD_SHAPE = (224, 224, 3)
MESSAGE_BYTES = 1 << 20
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


def image_record(seed: int) -> bytes:
    """A normalised-photo-like float32 record: smooth gradients plus sensor noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, w, c = RECORD_SHAPE
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    smooth = 0.5 + 0.4 * np.sin(
        x[..., None] / (17 + seed % 5) + y[..., None] / 29 + np.arange(c, dtype=np.float32)
    )
    noisy = smooth + rng.normal(0, 0.03, RECORD_SHAPE).astype(np.float32)
    return np.clip(noisy, 0, 1).astype(np.float32).tobytes()


def cpu_rows(records: list[bytes], count: int) -> dict[str, Row]:
    import zstandard

    from client.format.values import crc32 as codec_crc32

    compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
    frames = [compressor.compress(r) for r in records]
    decompressor = zstandard.ZstdDecompressor()

    def each(fn: Callable[[bytes], object]) -> Callable[[], int]:
        def run() -> int:
            for i in range(count):
                fn(records[i % len(records)])
            return count * len(records[0])

        return run

    def decompress() -> int:
        return sum(len(decompressor.decompress(frames[i % len(frames)])) for i in range(count))

    ratio_text = sum(map(len, records)) / sum(map(len, frames))
    print(f"zstd level 1 ratio on these records: {ratio_text:.3f}", file=sys.stderr)
    return {
        "memcpy": timed(each(lambda r: bytes(bytearray(r)))),
        "crc32 (zlib)": timed(each(zlib.crc32)),
        "crc32 (ISA-L, client/format/values.py)": timed(each(codec_crc32)),
        "zstd-1 compress": timed(each(compressor.compress)),
        "zstd decompress": timed(decompress),
    }


def serve(address: str, total: int) -> None:
    """A bare gRPC server in a child process, printing its port: 1 MiB messages streamed
    (Read) or swallowed (Write)."""
    from concurrent import futures

    import grpc

    payload = os.urandom(MESSAGE_BYTES)

    def read(_request: bytes, _context: Any) -> Iterator[bytes]:
        for _ in range(max(1, total // MESSAGE_BYTES)):
            yield payload

    def write(requests: Iterator[bytes], _context: Any) -> bytes:
        return str(sum(len(r) for r in requests)).encode()

    handler = grpc.method_handlers_generic_handler(
        "ceilings.Loopback",
        {
            "Read": grpc.unary_stream_rpc_method_handler(read),
            "Write": grpc.stream_unary_rpc_method_handler(write),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=(handler,), options=GRPC_OPTIONS)
    print(server.add_insecure_port(address), flush=True)
    server.start()
    server.wait_for_termination()


def grpc_rows(tmp: Path, total: int) -> dict[str, Row]:
    import grpc

    address = f"unix://{tmp}/loopback.sock"
    server, _ = server_process(__file__, "grpc", "--address", address, "--mb", str(total // MB))
    try:
        channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        read = channel.unary_stream("/ceilings.Loopback/Read")
        write = channel.stream_unary("/ceilings.Loopback/Write")
        message = os.urandom(MESSAGE_BYTES)
        rows = {
            "gRPC loopback read": timed(lambda: sum(len(m) for m in read(b"")), server.pid),
            "gRPC loopback write": timed(
                lambda: int(write(iter([message] * max(1, total // MESSAGE_BYTES)))), server.pid
            ),
        }
        channel.close()
        return rows
    finally:
        server.terminate()
        server.wait()


def daemon_rows(tmp: Path, records: list[bytes], count: int, cold: bool) -> dict[str, Row]:
    """WriteCache (over gRPC and same-host) and ReadShard (cold, then warm) of one daemon."""
    from client._transport import Transport, pb
    from client.write.direct import LocalWriter
    from client.write.stream import CacheWriter

    # stored records as write-through stores incompressible ones: 0x00, CRC-32, body
    stored = [b"\x00" + zlib.crc32(r).to_bytes(4, "little") + r for r in records]

    def write(name: str, local: bool) -> Callable[[], int]:
        def run() -> int:
            begin = pb.WriteBegin(
                name=name, fingerprint="ceilings", layout_json='{"format": 1, "leaves": []}'
            )
            writer = (
                LocalWriter(transport, begin, True, None)
                if local
                else CacheWriter(transport, begin)
            )
            writer.begin()
            for i in range(count):
                writer.add([stored[i % len(stored)]], len(records[0]))
            writer.finish()
            return count * len(stored[0])

        return run

    def read_shard() -> int:
        cache = transport.stub.GetCache(pb.GetCacheRequest(name="ceiling")).cache
        return sum(
            len(chunk.data)
            for shard in cache.shards
            for chunk in transport.stub.ReadShard(
                pb.ReadShardRequest(name="ceiling", shard=shard.index)
            )
        )

    daemon = BenchDaemon(tmp, "daemon")
    try:
        daemon.start()
        transport = Transport(daemon.target)
        rows = {
            "WriteCache": timed(write("ceiling", False), daemon.pid),
            "WriteCache, same-host": timed(write("ceiling-local", True), daemon.pid),
        }
        if cold:
            drop_page_cache()
            rows["ReadShard cold"] = timed(read_shard, daemon.pid)
        rows["ReadShard"] = timed(read_shard, daemon.pid)  # warm: the page cache holds it
        transport.close()
        return rows
    finally:
        daemon.stop()


def file_read_cold(tmp: Path, records: list[bytes], count: int) -> Row:
    path = tmp / "plain.bin"
    with open(path, "wb") as f:
        for i in range(count):
            f.write(records[i % len(records)])
    drop_page_cache()

    def read() -> int:
        moved = 0
        with open(path, "rb", buffering=0) as f:
            while block := f.read(1 << 20):
                moved += len(block)
        return moved

    return timed(read)


def render(rows: dict[str, Row]) -> str:
    base = rows["memcpy"][1] / rows["memcpy"][0]
    return markdown_table(
        ["layer (single stream)", "MB/s", "vs memcpy", "CPU s/GB here", "CPU s/GB server"],
        (
            [
                name,
                f"{moved / seconds / MB:,.0f}",
                ratio(moved / seconds, base),
                per_gb(own, moved),
                per_gb(server, moved),
            ]
            for name, (seconds, moved, own, server) in rows.items()
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, out=True)
    parser.add_argument("--mb", type=int, default=512, help="payload per row, MB")
    for hidden in ("--serve", "--address"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    total = args.mb * MB
    if args.serve:
        serve(args.address, total)
        return 0
    cold = os.geteuid() == 0
    if not cold:
        print("not root: the cold rows (which drop the page cache) are left out", file=sys.stderr)
    records = [image_record(seed) for seed in range(8)]
    count = max(1, total // len(records[0]))
    with tempfile.TemporaryDirectory(prefix="ceilings-") as tmp:
        rows = cpu_rows(records, count)
        rows.update(grpc_rows(Path(tmp), total))
        rows.update(daemon_rows(Path(tmp), records, count, cold))
        if cold:
            rows["file read cold"] = file_read_cold(Path(tmp), records, count)
    print(run_line())
    print(render(rows))
    write_json(args.out, {k: dict(zip(ROW_KEYS, v)) for k, v in rows.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
