"""Reproduces docs/benchmarks.md, "Transports for a data plane".

Transports for a data plane: 4 MiB chunks over TCP loopback, shardcache's planes beside.

    .venv/bin/python bench/transports.py [--mb 512] [--repeat 3] [--streams 1 2 4]

Candidates for a bulk data plane (framed TCP with ``sendfile``, HTTP Range, Arrow Flight,
grpcio with raw bytes) reading a warm file of ``--mb`` MB in 4 MiB chunks over TCP loopback,
each server in a process of its own, beside a raw ``sendfile`` -> ``recv_into`` stream; and a
shardcache daemon listening on 127.0.0.1 holding a cache of as many MB of incompressible
records, read whole in 4 MiB chunks by the client's own fetchers without decoding: its data
plane (``PlaneLease.fetcher``) and its gRPC reads (``Fetcher``). ``--streams``: 1, 2 and 4
connections (threads) per candidate. Every row runs once per round, ``--repeat`` rounds; the
table gives best and median GB/s, their ratios to raw's, and the CPU seconds per GB here and
in the server (docs/benchmarks.md, "Transports for a data plane").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from harness import GB, MB, BenchDaemon, arguments, server_process, write_json
from probes import run_line
from timing import ROW_KEYS, Row, markdown_table, per_gb, ratio, timed

GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
#: Chunks of the served file as (offset, length), a framed TCP request's header.
CHUNK = 4 << 20
Chunks = list[tuple[int, int]]
HEADER = struct.Struct("<QQ")
RAW = "raw: sendfile -> recv_into"
#: shardcache's records: 1 MiB stored each (0x00, CRC-32, body), so four make a 4 MiB chunk.
RECORD_BYTES = (1 << 20) - 5
#: Seconds a shardcache read may go without progress, as cc.dataset's reconnect_timeout.
RECONNECT_TIMEOUT = 30.0


def serve(kind: str, path: str) -> None:
    """A server of ``path``'s chunks in a child process; prints its port."""
    if kind in ("tcp", "http"):
        listener = socket.create_server(("127.0.0.1", 0))
        print(listener.getsockname()[1], flush=True)
    if kind == "tcp":
        fd = os.open(path, os.O_RDONLY)

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
            return web.FileResponse(path)  # sendfile, Range requests answered with 206

        app = web.Application()
        app.router.add_get("/data", file)
        web.run_app(app, sock=listener, print=None, access_log=None)
        return
    if kind == "flight":
        import pyarrow as pa
        from pyarrow import flight

        mapped, schema = pa.memory_map(path).read_buffer(), pa.schema([("data", pa.binary())])

        def batches(chunks: Chunks) -> Iterator[Any]:
            for offset, length in chunks:  # the value is a slice of the map, not a copy
                column = pa.Array.from_buffers(
                    pa.binary(),
                    1,
                    [
                        None,
                        pa.py_buffer(struct.pack("<ii", 0, length)),
                        mapped.slice(offset, length),
                    ],
                )
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

    fd = os.open(path, os.O_RDONLY)

    def chunks(request: bytes, _context: Any) -> Iterator[bytes]:
        for offset, length in json.loads(request):
            yield os.pread(fd, length, offset)

    handler = grpc.method_handlers_generic_handler(
        "transports.File", {"Chunks": grpc.unary_stream_rpc_method_handler(chunks)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=(handler,), options=GRPC_OPTIONS)
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    server.wait_for_termination()


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
                received = sock.recv_into(buffer[: min(length, CHUNK)])
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
        connection.request(
            "GET", "/data", headers={"Range": f"bytes={offset}-{offset + length - 1}"}
        )
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
        return sum(
            chunk.data.column(0).buffers()[2].size
            for chunk in client.do_get(flight.Ticket(json.dumps(chunks)))
        )


def grpc_read(port: int, chunks: Chunks, single_threaded: bool = False) -> int:
    import grpc.experimental

    options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]  # a connection each
    if single_threaded:
        options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_stream("/transports.File/Chunks")  # bytes in, bytes out
        return sum(len(message) for message in call(json.dumps(chunks).encode()))


class Shardcache:
    """A daemon on 127.0.0.1 holding one cache of ``total`` bytes of incompressible records,
    read whole in 4 MiB chunks by the client's fetchers, without decoding."""

    def __init__(self, tmp: Path, total: int) -> None:
        self.daemon = BenchDaemon(tmp, "shardcache", tcp=True)
        self.total = total

    def start(self) -> None:
        from client._transport import Transport, pb
        from client.read.fetching.fetch import chunk_positions
        from client.write.direct import LocalWriter

        self.daemon.start()
        records = [os.urandom(RECORD_BYTES) for _ in range(8)]
        stored = [b"\x00" + zlib.crc32(r).to_bytes(4, "little") + r for r in records]
        with_files = Transport(self.daemon.target)  # the unix socket: the shard file written here
        writer = LocalWriter(
            with_files,
            pb.WriteBegin(
                name="transports",
                fingerprint="transports",
                layout_json='{"format": 1, "leaves": []}',
            ),
            True,
            None,
        )
        writer.begin()
        for i in range(max(1, self.total // len(stored[0]))):
            writer.add([stored[i % len(stored)]], RECORD_BYTES)
        writer.finish()
        with_files.close()
        assert self.daemon.tcp_target is not None
        self.transport = Transport(self.daemon.tcp_target)  # a remote reader's
        self.cache = self.transport.call(
            self.transport.stub.GetCache, pb.GetCacheRequest(name="transports")
        ).cache
        n = self.cache.num_elements
        per_chunk = chunk_positions(self.cache, CHUNK)
        self.chunks = [range(a, min(a + per_chunk, n)) for a in range(0, n, per_chunk)]
        # what client/read/assembly/chunks.py asks per message: a chunk's bytes in one
        self.chunk_bytes = min(
            max(per_chunk * self.cache.stored_bytes // n + (64 << 10), 1 << 20), 16 << 20
        )

    def read(self, plane: bool, k: int, chunks: list[range] | None = None) -> int:
        """The cache's chunks (default: all), dealt round-robin to k threads, over the data
        plane (a lease of its own, its connections opened here) or gRPC (the channel's)."""
        from client.read.fetching.fetch import Calls, Remote
        from client.read.fetching.plane import PlaneFetcher, for_transport
        from client.read.fetching.reconnect import Reconnecting
        from client.read.fetching.rpc import GrpcFetcher

        chunks = self.chunks if chunks is None else chunks
        calls = Calls()
        grpc_fetcher = GrpcFetcher(self.transport, self.cache, calls, self.chunk_bytes)
        remote: Remote = grpc_fetcher
        lease = None
        if plane:
            lease = for_transport(self.transport).lease(self.cache)
            if lease is None:
                raise RuntimeError(
                    f"the daemon at {self.transport.target} offers no data "
                    f"plane (or $SHARDCACHE_DATA_PLANE=off): see its log, "
                    f"{self.daemon.log_path}"
                )
            remote = PlaneFetcher(lease, grpc_fetcher)
        fetcher = Reconnecting(remote, calls, self.cache.name, RECONNECT_TIMEOUT)

        def share(j: int) -> int:
            return sum(len(data) for run in chunks[j::k] for _, _, data in fetcher.stream(run))

        try:
            with ThreadPoolExecutor(k) as pool:
                moved = sum(pool.map(share, range(k)))
            if lease is not None and (lease.ended or not lease.worked):
                raise RuntimeError(
                    "the data plane read fell back to gRPC: see the log above "
                    f"and the daemon's, {self.daemon.log_path}"
                )
            return moved
        finally:
            fetcher.close()

    def stop(self) -> None:
        if hasattr(self, "transport"):
            self.transport.close()
        self.daemon.stop()


def transport_rows(
    tmp: Path,
    total: int,
    repeat: int,
    streams: list[int],
) -> dict[str, list[Row]]:
    """Each candidate reads the whole file (shardcache: its cache), ``repeat`` times,
    interleaved with the others."""
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

    readers: dict[str, tuple[str, Callable[[int, Chunks], int]]] = {
        "framed TCP": ("tcp", tcp_read),
        "HTTP Range": ("http", http_read),
        "Flight DoGet": ("flight", flight_read),
        "gRPC": ("grpc", grpc_read),
        "gRPC single-threaded": ("grpc", partial(grpc_read, single_threaded=True)),
    }
    servers: dict[str, tuple[Any, int]] = {}
    shardcache = Shardcache(tmp, total)
    try:
        for kind in ("tcp", "http", "flight", "grpc"):
            servers[kind] = server_process(__file__, kind, "--file", str(path))
        shardcache.start()
        # (name, read, server's pid, bytes it must move)
        cases: list[tuple[str, Callable[[], int], int, int]] = [
            (
                RAW,
                partial(tcp_read, servers["tcp"][1], chunks, whole=True),
                servers["tcp"][0].pid,
                size,
            )
        ]
        cases += [
            (f"{name} x{k}", partial(split(read, k), servers[kind][1]), servers[kind][0].pid, size)
            for name, (kind, read) in readers.items()
            for k in streams
        ]
        cases += [
            (
                f"shardcache {label} x{k}",
                partial(shardcache.read, plane, k),
                shardcache.daemon.pid,
                shardcache.cache.stored_bytes,
            )
            for label, plane in (("data plane", True), ("gRPC", False))
            for k in streams
        ]
        for kind, read in readers.values():  # untimed: connections, threads, first buffers
            read(servers[kind][1], chunks[:2])
        shardcache.read(True, 1)  # untimed: the daemon's first touch of the LMDB map
        shardcache.read(False, 1, shardcache.chunks[:2])
        results: dict[str, list[Row]] = {name: [] for name, *_ in cases}
        for _ in range(repeat):
            for name, run, pid, expected in cases:
                row = timed(run, pid)
                if row[1] != expected:
                    raise RuntimeError(f"{name} moved {row[1]:,} of {expected:,} bytes")
                results[name].append(row)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
        shardcache.stop()
    return results


def render(results: dict[str, list[Row]]) -> str:
    def rate(row: Row) -> float:
        return row[1] / row[0]

    best = {name: max(rows, key=rate) for name, rows in results.items()}
    median = {name: sorted(rows, key=rate)[(len(rows) - 1) // 2] for name, rows in results.items()}
    return markdown_table(
        [
            "transport x connections",
            "best GB/s",
            "median GB/s",
            "best vs raw",
            "median vs raw",
            "CPU s/GB here",
            "CPU s/GB server",
        ],
        (
            [
                name,
                f"{rate(best[name]) / GB:.2f}",
                f"{rate(median[name]) / GB:.2f}",
                ratio(rate(best[name]), rate(best[RAW])),
                ratio(rate(median[name]), rate(median[RAW])),
                per_gb(median[name][2], median[name][1]),
                per_gb(median[name][3], median[name][1]),
            ]
            for name in results
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, out=True, repeat=3)
    parser.add_argument("--mb", type=int, default=512, help="payload per row, MB")
    parser.add_argument(
        "--streams",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="connections in parallel per candidate",
    )
    for hidden in ("--serve", "--file"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.file)
        return 0
    with tempfile.TemporaryDirectory(prefix="transports-") as tmp:
        results = transport_rows(Path(tmp), args.mb * MB, args.repeat, args.streams)
    print(run_line())
    print(render(results))
    write_json(
        args.out, {k: [dict(zip(ROW_KEYS, row)) for row in rows] for k, rows in results.items()}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
