"""Prometheus metrics of the daemon, in base units, without per-shard labels.

All metrics live in :data:`REGISTRY` (not prometheus_client's global one, so
tests can run several servers in one process). Other modules add their own
metrics to it the same way: ``Counter("shardcache_...", "...", registry=REGISTRY)``.
``serve --metrics-listen HOST:PORT`` exposes it at ``/metrics``, with
``--metrics-token-file`` only to scrapes carrying that bearer token, with
``--metrics-tls`` over HTTPS.

Definitions (docs/operations.md):
- a hit is one reader's pass over its share of an epoch (the first request of
  the pass carries epoch_start), or a raw ReadShard of a whole shard;
- a miss is a WriteBegin answered ACCEPTED (the cache had to be built).
"""

from __future__ import annotations

import hmac
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

READ_BYTES = Counter(
    "shardcache_read_bytes",
    "Record bytes sent by ReadShard and ReadElements, by plane: grpc, or data "
    "(the data port's connections).",
    ["plane"],
    unit="bytes",
    registry=REGISTRY,
)
for _plane in ("grpc", "data"):  # both series from the start, at 0
    READ_BYTES.labels(_plane)
DATA_CONNECTIONS = Gauge(
    "shardcache_data_connections", "Open data-plane connections.", registry=REGISTRY
)
DATA_REFUSED = Counter(
    "shardcache_data_refused",
    "Data-plane connections refused, by reason (a status reason).",
    ["reason"],
    registry=REGISTRY,
)
DATA_FALLBACKS = Counter(
    "shardcache_data_fallbacks",
    "Read leases whose holder took a data-plane ticket and read over gRPC "
    "instead: it cannot reach the data port (a firewall passing only the "
    "gRPC port).",
    registry=REGISTRY,
)
ACCESS_DENIED = Counter(
    "shardcache_access_denied",
    "Calls refused PERMISSION_DENIED by the credentials' grants (--auth-file), "
    "by the verb asked for: read, write or admin.",
    ["verb"],
    registry=REGISTRY,
)
for _verb in ("read", "write", "admin"):
    ACCESS_DENIED.labels(_verb)
READ_ELEMENTS = Counter(
    "shardcache_read_elements",
    "Elements sent by ReadShard and ReadElements (not blocks).",
    registry=REGISTRY,
)
WRITTEN_BYTES = Counter(
    "shardcache_written_bytes",
    "Record bytes stored by WriteCache.",
    unit="bytes",
    registry=REGISTRY,
)
WRITTEN_ELEMENTS = Counter(
    "shardcache_written_elements", "Records stored by WriteCache.", registry=REGISTRY
)
CACHE_HITS = Counter(
    "shardcache_cache_hits",
    "Reader passes over a cache (see docs/operations.md).",
    registry=REGISTRY,
)
CACHE_MISSES = Counter(
    "shardcache_cache_misses",
    "WriteBegin answered ACCEPTED: a cache had to be built.",
    registry=REGISTRY,
)
ACTIVE_STREAMS = Gauge(
    "shardcache_active_streams", "Open ReadShard / WriteCache streams.", ["kind"], registry=REGISTRY
)
EVICTIONS = Counter(
    "shardcache_evictions", "Caches deleted by the daemon itself.", ["reason"], registry=REGISTRY
)
RPC_ERRORS = Counter(
    "shardcache_rpc_errors",
    "Calls that ended with a status other than OK.",
    ["method", "code"],
    registry=REGISTRY,
)
RPC_DURATION = Histogram(
    "shardcache_rpc_duration_seconds",
    "Duration of calls.",
    ["method"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10, 60, 300, 1800),
)
DISK_BYTES = Gauge(
    "shardcache_disk_bytes",
    "Bytes of caches on disk (committed files plus records of writes in progress).",
    unit="bytes",
    registry=REGISTRY,
)
CAPACITY_BYTES = Gauge(
    "shardcache_capacity_bytes", "--max-bytes (0: no limit).", unit="bytes", registry=REGISTRY
)
DISK_FREE_BYTES = Gauge(
    "shardcache_disk_free_bytes",
    "Free space on the data dir's filesystem (below 1 MiB: disk full, writes refused).",
    unit="bytes",
    registry=REGISTRY,
)
MATERIALIZED_ELEMENTS = Counter(
    "shardcache_materialized_elements",
    "Elements stored by materialization workers.",
    registry=REGISTRY,
)
MATERIALIZED_BYTES = Counter(
    "shardcache_materialized_bytes",
    "Record bytes stored by materialization workers.",
    unit="bytes",
    registry=REGISTRY,
)
MATERIALIZED_SHARDS = Counter(
    "shardcache_materialized_shards",
    "Shards committed by materialization workers.",
    registry=REGISTRY,
)
MATERIALIZATIONS = Counter(
    "shardcache_materializations",
    "Materialization operations that ended, by final state.",
    ["state"],
    registry=REGISTRY,
)
DIRECT_LEASES = Gauge(
    "shardcache_direct_leases",
    "Read leases of same-host clients reading shard files directly.",
    registry=REGISTRY,
)
DIRECT_READS = Counter(
    "shardcache_direct_reads",
    "Direct reader passes: read leases taken with epoch_start (docs/direct.md).",
    registry=REGISTRY,
)
STORE_PUBLISHED_BYTES = Counter(
    "shardcache_store_published_bytes",
    "Shard file bytes uploaded to the object store.",
    unit="bytes",
    registry=REGISTRY,
)
STORE_PULLED_BYTES = Counter(
    "shardcache_store_pulled_bytes",
    "Shard file bytes fetched from the object store.",
    unit="bytes",
    registry=REGISTRY,
)
STORE_ERRORS = Counter(
    "shardcache_store_errors",
    "Object store operations that failed (publish: retried with backoff).",
    ["op"],
    registry=REGISTRY,
)
STORE_REQUESTS = Counter(
    "shardcache_store_requests",
    "Requests sent to the object store, retries included, by kind as the "
    "store's price list counts them: GET, PUT (every write: PutObject, "
    "multipart parts), HEAD, LIST, DELETE.",
    ["op"],
    registry=REGISTRY,
)
STORE_BYTES = Counter(
    "shardcache_store_bytes",
    "Bytes to and from the object store, retries included: out (request "
    "bodies), in (answers, by their Content-Length).",
    ["direction"],
    unit="bytes",
    registry=REGISTRY,
)
READERS_DROPPED = Counter(
    "shardcache_readers_dropped",
    "Readers forgotten before their expiry to keep at most 256 "
    "(cacheserver/reader_reports.py): the one reported longest ago first.",
    registry=REGISTRY,
)
STORE_UNPUBLISHED = Gauge(
    "shardcache_store_unpublished_caches",
    "Committed caches waiting to be published (or retrying).",
    registry=REGISTRY,
)


class Residency(Collector):
    """Per cache, for the caches larger than the daemon's room (partially resident,
    cacheserver/catalog/pulls.py): resident shards and bytes, store bytes streamed,
    shard reads by where they were served, and the hit ratio. ``source`` gives
    name -> (resident shards, resident bytes, streamed bytes, resident reads, streamed
    reads, of those read directly); the daemon's store tier sets it."""

    def __init__(self) -> None:
        self.source: Callable[[], dict[str, tuple[int, int, int, int, int, int]]] = dict

    def collect(self) -> Any:
        shards = GaugeMetricFamily(
            "shardcache_cache_resident_shards",
            "Shards of a partially resident cache on local disk.",
            labels=["cache"],
        )
        nbytes = GaugeMetricFamily(
            "shardcache_cache_resident_bytes",
            "Bytes of a partially resident cache's shards on local disk.",
            labels=["cache"],
            unit="bytes",
        )
        streamed = CounterMetricFamily(
            "shardcache_cache_streamed_bytes",
            "Store bytes fetched to stream a partially resident cache's other shards.",
            labels=["cache"],
            unit="bytes",
        )
        reads = CounterMetricFamily(
            "shardcache_cache_shard_reads",
            "Shard reads of a partially resident cache (one per read request and shard), "
            "by where they were served: resident or streamed.",
            labels=["cache", "source"],
        )
        direct = CounterMetricFamily(
            "shardcache_cache_streamed_direct_reads",
            "Of a partially resident cache's streamed shard reads, those same-host readers "
            "read from the stream window's files themselves (HoldStreamedShard).",
            labels=["cache"],
        )
        ratio = GaugeMetricFamily(
            "shardcache_cache_hit_ratio",
            "Of a partially resident cache's shard reads, those served from resident shards.",
            labels=["cache"],
        )
        for name, (n, b, s, hit, miss, held) in sorted(self.source().items()):
            shards.add_metric([name], n)
            nbytes.add_metric([name], b)
            streamed.add_metric([name], s)
            reads.add_metric([name, "resident"], hit)
            reads.add_metric([name, "streamed"], miss)
            direct.add_metric([name], held)
            ratio.add_metric([name], hit / (hit + miss) if hit + miss else 1.0)
        yield from (shards, nbytes, streamed, reads, direct, ratio)


RESIDENCY = Residency()
REGISTRY.register(RESIDENCY)

for _kind in ("read", "write"):
    ACTIVE_STREAMS.labels(_kind)
for _reason in ("capacity", "ttl"):
    EVICTIONS.labels(_reason)
for _op in ("publish", "pull"):
    STORE_ERRORS.labels(_op)
for _op in ("GET", "PUT", "HEAD", "LIST", "DELETE"):
    STORE_REQUESTS.labels(_op)
for _direction in ("in", "out"):
    STORE_BYTES.labels(_direction)
for _state in ("SUCCEEDED", "FAILED", "CANCELLED"):
    MATERIALIZATIONS.labels(_state)


def watch_disk(in_use: Callable[[], int], max_bytes: int) -> None:
    """Make the disk gauges report in_use() at every scrape."""
    DISK_BYTES.set_function(in_use)
    CAPACITY_BYTES.set(max_bytes)


class MetricsListenError(ValueError):
    """--metrics-listen is malformed or cannot be bound."""


def _guarded(app: Any, token: bytes | None) -> Any:
    """The WSGI app, answering 401 to a request without ``Authorization: Bearer token``."""
    if token is None:
        return app

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        scheme, _, presented = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="metrics"')],
        )
        return [b"this /metrics needs Authorization: Bearer <the daemon's --metrics-token-file>\n"]

    return guarded


class _Quiet(WSGIRequestHandler):
    timeout = 10.0  # seconds a scraper has for its TLS handshake and request

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_http(
    address: str, token: bytes | None = None, tls: ssl.SSLContext | None = None
) -> tuple[str, Callable[[], None]]:
    """Serve /metrics on HOST:PORT, asking for a bearer token and speaking TLS when given;
    returns the bound address and a stop function."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise MetricsListenError(
            f"--metrics-listen {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9464"
        )

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET

    try:
        server = make_server(
            host.strip("[]"),
            int(port),
            _guarded(make_wsgi_app(REGISTRY), token),
            Server,
            handler_class=_Quiet,
        )
    except OSError as exc:
        raise MetricsListenError(f"cannot serve metrics on {address}: {exc.strerror}") from exc
    if tls is not None:
        # the handshake happens in the connection's thread, not in the accept loop
        server.socket = tls.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return f"{host}:{server.server_port}", stop
