"""What each layer of the read and write paths moves alone; what bulk transports move.

    .venv/bin/python bench/ceilings.py [--mb 512]      # root adds the cold rows

Every row moves ``--mb`` MB of 602 KB float32 image records (smooth plus noise, like a
normalised photo): a ``memcpy``; CRC-32 (zlib, ISA-L); zstd-1 compress and decompress; a bare
Python gRPC server in another process streaming 1 MiB messages over a unix socket; a daemon's
``WriteCache`` (over gRPC, and same-host: the client writing the shard file) and
``ReadShard`` (no decoding, no TensorFlow; cold and warm); a plain file read cold. The table
gives MB/s, the ratio to ``memcpy`` and the CPU seconds per GB here and in the server.

    .venv/bin/python bench/ceilings.py --transports [--mb 512] [--repeat 3] [--streams 1 2 4]

Candidates for a bulk data plane (framed TCP with ``sendfile``, HTTP Range, Arrow Flight,
grpcio with raw bytes) reading a warm file in 4 MiB chunks over TCP loopback, beside a raw
``sendfile`` -> ``recv_into`` stream (docs/benchmarks.md, "Transports for a data plane").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from harness import (
    GB,
    MB,
    BenchDaemon,
    arguments,
    cpu_seconds,
    drop_page_cache,
    markdown_table,
    ratio,
    run_line,
    write_json,
)

RECORD_SHAPE = (224, 224, 3)
MESSAGE_BYTES = 1 << 20
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
#: A row: seconds, bytes moved, CPU seconds of this process and of the server.
Row = tuple[float, int, float, float]
ROW_KEYS = ("seconds", "bytes", "cpu", "server_cpu")
#: --transports: chunks of the served file as (offset, length), a framed TCP request's header.
CHUNK = 4 << 20
Chunks = list[tuple[int, int]]
HEADER = struct.Struct("<QQ")
RAW = "raw: sendfile -> recv_into"


def image_record(seed: int) -> bytes:
    """A normalised-photo-like float32 record: smooth gradients plus sensor noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, w, c = RECORD_SHAPE
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    smooth = 0.5 + 0.4 * np.sin(x[..., None] / (17 + seed % 5) + y[..., None] / 29
                                + np.arange(c, dtype=np.float32))
    noisy = smooth + rng.normal(0, 0.03, RECORD_SHAPE).astype(np.float32)
    return np.clip(noisy, 0, 1).astype(np.float32).tobytes()


def timed(fn: Callable[[], int], server_pid: int = 0) -> Row:
    """Run fn (returning bytes moved): its seconds, bytes and CPU seconds (self, server)."""
    before, server_before = cpu_seconds(), cpu_seconds(server_pid) if server_pid else 0.0
    start = time.perf_counter()
    moved = fn()
    seconds = time.perf_counter() - start
    server = cpu_seconds(server_pid) - server_before if server_pid else 0.0
    return seconds, moved, cpu_seconds() - before, server


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
    return {"memcpy": timed(each(lambda r: bytes(bytearray(r)))),
            "crc32 (zlib)": timed(each(zlib.crc32)),
            "crc32 (ISA-L, client/format/values.py)": timed(each(codec_crc32)),
            "zstd-1 compress": timed(each(compressor.compress)),
            "zstd decompress": timed(decompress)}


def serve(kind: str, address: str, total: int, path: str | None) -> None:
    """A server in a child process; prints its port. grpc: 1 MiB messages streamed or
    swallowed (the loopback rows) and ``path``'s chunks; the others: ``path``'s chunks."""
    if kind in ("tcp", "http"):
        listener = socket.create_server(("127.0.0.1", 0))
        print(listener.getsockname()[1], flush=True)
    if kind == "tcp":
        fd = os.open(str(path), os.O_RDONLY)

        def answer(conn: socket.socket) -> None:
            with conn:
                while header := conn.recv(HEADER.size, socket.MSG_WAITALL):
                    offset, length = HEADER.unpack(header)
                    while length:
                        sent = os.sendfile(conn.fileno(), fd, offset, length)
                        offset, length = offset + sent, length - sent

        while True:
            threading.Thread(target=answer, args=(listener.accept()[0],), daemon=True).start()
    if kind == "http":
        from aiohttp import web

        async def file(_request: Any) -> Any:
            return web.FileResponse(str(path))  # sendfile, Range requests answered with 206

        app = web.Application()
        app.router.add_get("/data", file)
        web.run_app(app, sock=listener, print=None, access_log=None)
        return
    if kind == "flight":
        import pyarrow as pa
        from pyarrow import flight

        mapped, schema = pa.memory_map(str(path)).read_buffer(), pa.schema([("data", pa.binary())])

        def batches(chunks: Chunks) -> Iterator[Any]:
            for offset, length in chunks:  # the value is a slice of the map, not a copy
                column = pa.Array.from_buffers(pa.binary(), 1, [
                    None, pa.py_buffer(struct.pack("<ii", 0, length)),
                    mapped.slice(offset, length)])
                yield pa.RecordBatch.from_arrays([column], schema=schema)

        class Server(flight.FlightServerBase):
            def do_get(self, _context: Any, ticket: Any) -> Any:
                return flight.GeneratorStream(schema, batches(json.loads(ticket.ticket)))

        server = Server("grpc://127.0.0.1:0")
        print(server.port, flush=True)
        server.serve()
        return
    from concurrent import futures

    import grpc

    payload = os.urandom(MESSAGE_BYTES)
    fd = os.open(path, os.O_RDONLY) if path else -1

    def read(_request: bytes, _context: Any) -> Iterator[bytes]:
        for _ in range(max(1, total // MESSAGE_BYTES)):
            yield payload

    def write(requests: Iterator[bytes], _context: Any) -> bytes:
        return str(sum(len(r) for r in requests)).encode()

    def chunks(request: bytes, _context: Any) -> Iterator[bytes]:
        for offset, length in json.loads(request):
            yield os.pread(fd, length, offset)

    handler = grpc.method_handlers_generic_handler("ceilings.Loopback", {
        "Read": grpc.unary_stream_rpc_method_handler(read),
        "Write": grpc.stream_unary_rpc_method_handler(write),
        "Chunks": grpc.unary_stream_rpc_method_handler(chunks)})
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=(handler,), options=GRPC_OPTIONS)
    print(server.add_insecure_port(address), flush=True)
    server.start()
    server.wait_for_termination()


def start_server(kind: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """One of :func:`serve`'s servers in a process of its own, and its port."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, *args],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline() or 0)


def grpc_rows(tmp: Path, total: int) -> dict[str, Row]:
    import grpc

    address = f"unix://{tmp}/loopback.sock"
    server, _ = start_server("grpc", "--address", address, "--mb", str(total // MB))
    try:
        channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        read = channel.unary_stream("/ceilings.Loopback/Read")
        write = channel.stream_unary("/ceilings.Loopback/Write")
        message = os.urandom(MESSAGE_BYTES)
        rows = {"gRPC loopback read": timed(lambda: sum(len(m) for m in read(b"")), server.pid),
                "gRPC loopback write": timed(lambda: int(write(iter(
                    [message] * max(1, total // MESSAGE_BYTES)))), server.pid)}
        channel.close()
        return rows
    finally:
        server.terminate()
        server.wait()


# ---------------------------------------------------------------------- --transports
def tcp_read(port: int, chunks: Chunks, whole: bool = False) -> int:
    """Framed TCP: one request ahead; ``whole`` asks for all of ``chunks`` at once (raw)."""
    buffer = memoryview(bytearray(CHUNK))
    requests = [(chunks[0][0], sum(n for _, n in chunks))] if whole else chunks
    moved = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(HEADER.pack(*requests[0]))
        for i, (_, length) in enumerate(requests):
            if i + 1 < len(requests):
                sock.sendall(HEADER.pack(*requests[i + 1]))
            while length:
                received = sock.recv_into(buffer[:min(length, CHUNK)])
                if not received:
                    raise ConnectionError("the framed TCP server closed the connection")
                moved, length = moved + received, length - received
    return moved


def http_read(port: int, chunks: Chunks) -> int:
    import http.client

    buffer = memoryview(bytearray(CHUNK))
    connection = http.client.HTTPConnection("127.0.0.1", port)
    moved = 0
    for offset, length in chunks:
        connection.request("GET", "/data", headers={
            "Range": f"bytes={offset}-{offset + length - 1}"})
        response = connection.getresponse()
        if response.status != 206:
            raise ConnectionError(f"HTTP {response.status} for a Range request")
        while received := response.readinto(buffer[:length]):
            moved += received
    connection.close()
    return moved


def flight_read(port: int, chunks: Chunks) -> int:
    from pyarrow import flight

    with flight.connect(f"grpc://127.0.0.1:{port}") as client:
        return sum(chunk.data.column(0).buffers()[2].size
                   for chunk in client.do_get(flight.Ticket(json.dumps(chunks))))


def grpc_read(port: int, chunks: Chunks, single_threaded: bool = False) -> int:
    import grpc.experimental

    options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]  # a connection each
    if single_threaded:
        options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_stream("/ceilings.Loopback/Chunks")  # bytes in, bytes out
        return sum(len(message) for message in call(json.dumps(chunks).encode()))


def transport_rows(tmp: Path, total: int, repeat: int, streams: list[int],
                   ) -> dict[str, list[Row]]:
    """Each candidate reads the whole file, ``repeat`` times, interleaved with the others."""
    path = tmp / "payload.bin"
    with open(path, "wb") as f:  # written here, so warm: the page cache holds it
        for _ in range(max(1, total // CHUNK)):
            f.write(os.urandom(CHUNK))
    size = path.stat().st_size
    chunks = [(offset, CHUNK) for offset in range(0, size, CHUNK)]

    def split(read: Callable[[int, Chunks], int], k: int) -> Callable[[int], int]:
        def run(port: int) -> int:  # connection j reads chunks j, j + k, ...
            with ThreadPoolExecutor(k) as pool:
                return sum(pool.map(lambda j: read(port, chunks[j::k]), range(k)))
        return run

    readers = {"framed TCP": ("tcp", tcp_read), "HTTP Range": ("http", http_read),
               "Flight DoGet": ("flight", flight_read), "gRPC": ("grpc", grpc_read),
               "gRPC single-threaded": ("grpc", partial(grpc_read, single_threaded=True))}
    cases = [(RAW, "tcp", lambda port: tcp_read(port, chunks, whole=True))]
    cases += [(f"{name} x{k}", kind, split(read, k))
              for name, (kind, read) in readers.items() for k in streams]
    servers = {kind: start_server(kind, "--file", str(path)) for kind in ("tcp", "http",
                                                                          "flight", "grpc")}
    results: dict[str, list[Row]] = {name: [] for name, _, _ in cases}
    try:
        for kind, read in readers.values():  # untimed: connections, threads, first buffers
            read(servers[kind][1], chunks[:2])
        for _ in range(repeat):
            for name, kind, run in cases:
                proc, port = servers[kind]
                row = timed(partial(run, port), proc.pid)
                if row[1] != size:
                    raise RuntimeError(f"{name} moved {row[1]:,} of {size:,} bytes")
                results[name].append(row)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    return results


def render_transports(results: dict[str, list[Row]]) -> str:
    def rate(row: Row) -> float:
        return row[1] / row[0]

    best = {name: max(rows, key=rate) for name, rows in results.items()}
    median = {name: sorted(rows, key=rate)[(len(rows) - 1) // 2] for name, rows in results.items()}
    return markdown_table(
        ["transport x connections", "best GB/s", "median GB/s", "best vs raw", "median vs raw",
         "CPU s/GB here", "CPU s/GB server"],
        ([name, f"{rate(best[name]) / GB:.2f}", f"{rate(median[name]) / GB:.2f}",
          ratio(rate(best[name]), rate(best[RAW])), ratio(rate(median[name]), rate(median[RAW])),
          per_gb(median[name][2], median[name][1]), per_gb(median[name][3], median[name][1])]
         for name in results))


def daemon_rows(tmp: Path, records: list[bytes], count: int, cold: bool) -> dict[str, Row]:
    """WriteCache (over gRPC and same-host) and ReadShard (cold, then warm) of one daemon."""
    from client._transport import Transport, pb
    from client.write.direct import LocalWriter
    from client.write.stream import CacheWriter

    # stored records as write-through stores incompressible ones: 0x00, CRC-32, body
    stored = [b"\x00" + zlib.crc32(r).to_bytes(4, "little") + r for r in records]

    def write(name: str, local: bool) -> Callable[[], int]:
        def run() -> int:
            begin = pb.WriteBegin(name=name, fingerprint="ceilings",
                                  layout_json='{"format": 1, "leaves": []}')
            writer = (LocalWriter(transport, begin, True, None) if local
                      else CacheWriter(transport, begin))
            writer.begin()
            for i in range(count):
                writer.add([stored[i % len(stored)]], len(records[0]))
            writer.finish()
            return count * len(stored[0])
        return run

    def read_shard() -> int:
        cache = transport.stub.GetCache(pb.GetCacheRequest(name="ceiling")).cache
        return sum(len(chunk.data) for shard in cache.shards for chunk in
                   transport.stub.ReadShard(pb.ReadShardRequest(name="ceiling",
                                                                shard=shard.index)))

    daemon = BenchDaemon(tmp, "daemon")
    try:
        daemon.start()
        transport = Transport(daemon.target)
        rows = {"WriteCache": timed(write("ceiling", False), daemon.pid),
                "WriteCache, same-host": timed(write("ceiling-local", True), daemon.pid)}
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


def per_gb(cpu: float, moved: int) -> str:
    return f"{cpu / (moved / GB):.2f}" if cpu else "-"


def render(rows: dict[str, Row]) -> str:
    base = rows["memcpy"][1] / rows["memcpy"][0]
    return markdown_table(
        ["layer (single stream)", "MB/s", "vs memcpy", "CPU s/GB here", "CPU s/GB server"],
        ([name, f"{moved / seconds / MB:,.0f}", ratio(moved / seconds, base),
          per_gb(own, moved), per_gb(server, moved)]
         for name, (seconds, moved, own, server) in rows.items()))


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, out=True, repeat=3)
    parser.add_argument("--mb", type=int, default=512, help="payload per row, MB")
    parser.add_argument("--transports", action="store_true",
                        help="the data plane's candidates instead of the layers (--repeat)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4],
                        help="connections in parallel per candidate (--transports)")
    for hidden in ("--serve", "--address", "--file"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    total = args.mb * MB
    if args.serve:
        serve(args.serve, args.address or "127.0.0.1:0", total, args.file)
        return 0
    if args.transports:
        with tempfile.TemporaryDirectory(prefix="ceilings-") as tmp:
            results = transport_rows(Path(tmp), total, args.repeat, args.streams)
        print(run_line())
        print(render_transports(results))
        write_json(args.out, {k: [dict(zip(ROW_KEYS, row)) for row in rows]
                              for k, rows in results.items()})
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
