"""The daemon process: gRPC server, health, reflection, listeners, graceful stop."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cacheserver import metrics
from cacheserver.access import Authority
from cacheserver.catalog.capacity import Capacity, DiskWatch, TtlSweeper
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.leases import LeaseTable
from cacheserver.catalog.recovery import DataDirLock
from cacheserver.config import DEFAULT_LISTEN
from cacheserver.materialize.materializer import Materializer
from cacheserver.materialize.policy import Policy
from cacheserver.plane.server import DataPlane
from cacheserver.rpc import admission
from cacheserver.rpc.callers import Callers
from cacheserver.rpc.interceptors import ServerInterceptor
from cacheserver.rpc.service import CacheService
from cacheserver.rpc.streams import wire_handlers
from cacheserver.security import SecurityConfigError, load_tls, load_token, warn_if_exposed
from cacheserver.tier.bucket import Bucket, StoreRefused
from client.wire.limits import MAX_MESSAGE_BYTES
from client.wire.status import StoreUnavailable
from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CacheService"].full_name
#: A health service name that is NOT_SERVING while the disk is full (reads go on).
WRITES_HEALTH_SERVICE = "shardcache.writes"


def sd_notify(state: str) -> bool:
    """Tell systemd (Type=notify) about a state change, e.g. "READY=1".

    A no-op returning False unless $NOTIFY_SOCKET is set; a leading '@' names
    a socket in the abstract namespace. Errors are logged, never raised.
    """
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify(%r) to %s failed: %s", state, address.lstrip("\0"), exc)
        return False
    return True


class LimitsError(ValueError):
    """--max-streams, --max-streams-per-client and --max-workers do not fit together."""


def stream_limits(max_workers: int, max_streams: int, per_client: int) -> tuple[int, int]:
    """(streams in all, streams per client host): below the streams' threads.

    A stream beyond a limit needs a free thread to be refused at once (otherwise
    it waits in the pool's queue); unary calls and health checks have threads of
    their own (admission.CONTROL_WORKERS) whatever the streams do.
    """
    total = max_streams or max(max_workers * 7 // 8, 1)
    if total >= max_workers:
        raise LimitsError(
            f"--max-streams {total} must be below --max-workers {max_workers} "
            "(a stream beyond the limit needs a free thread to be refused): "
            "raise --max-workers or lower --max-streams"
        )
    return total, min(per_client, total)


class ListenError(ValueError):
    """A --listen address is malformed or cannot be bound."""


@dataclass
class ServerConfig:
    data_dir: Path
    listen: list[str] = field(default_factory=lambda: [DEFAULT_LISTEN])
    grace_seconds: float = 30.0
    max_workers: int = 64
    # operations (docs/operations.md; cacheserver/config.py has the one table)
    shutdown_delay: float = 0.0
    max_bytes: int = 0
    min_free_bytes: int = 0
    ttl_sweep_interval: float = 60.0
    lease_ttl: float = 30.0
    metrics_listen: str = ""
    metrics_token_file: Path | None = None
    metrics_tls: bool = False
    metrics_readers: bool = True
    data_listen: str = "auto"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    auth_token_file: Path | None = None
    auth_file: Path | None = None
    socket_mode: int = 0o660
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_streams_per_client: int = 48
    max_streams: int = 0  # 0: 7/8 of max_workers (stream_limits)
    stream_idle_timeout: float = 120.0
    #: Directories materialization workers import entry points from (--pythonpath).
    pythonpath: list[Path] = field(default_factory=list)
    #: What StartMaterialize may run (--materialize-allow, --allow-shipped-pipelines).
    materialize_allow: list[str] = field(default_factory=list)
    allow_shipped_pipelines: bool = False
    #: The object store under the local caches (--store, --store-endpoint): empty, none.
    store: str = ""
    store_endpoint: str = ""
    store_pull: str = "all"  # or "on-read": only the shards read here (a fleet member)


def normalize_listen(address: str) -> str:
    """Check a --listen address: 'host:port' or 'unix:///absolute/path'."""
    if address.startswith("unix:"):
        path = (
            address.removeprefix("unix://")
            if address.startswith("unix://")
            else address.removeprefix("unix:")
        )
        if not path.startswith("/"):
            raise ListenError(
                f"--listen {address!r}: a unix socket needs an absolute path, "
                "as in unix:///run/cacheserver/cacheserver.sock"
            )
        return f"unix://{path}"
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(
            f"--listen {address!r}: expected HOST:PORT (e.g. 127.0.0.1:50051) "
            "or unix:///path/to.sock"
        )
    return address


def data_address(config: ServerConfig) -> str:
    """--data-listen as HOST:PORT, or "" (off; auto with no TCP --listen)."""
    value = config.data_listen.strip()
    if value == "off":
        return ""
    if value == "auto":
        tcp = [a for a in config.listen if not a.startswith("unix:")]
        return f"{tcp[0].rpartition(':')[0]}:0" if tcp else ""
    if value.startswith("unix:"):
        raise ListenError(
            f"--data-listen {value!r}: the data plane is TCP (HOST:PORT); unix "
            "socket clients are on the daemon's host and read its files directly"
        )
    try:
        return normalize_listen(value)
    except ListenError as exc:
        raise ListenError(str(exc).replace("--listen", "--data-listen")) from None


def open_store(config: ServerConfig) -> Bucket | None:
    """The --store bucket, checked once: a store that refuses (no such bucket, bad
    credentials) stops the start; one that cannot be reached is retried later."""
    if not config.store:
        return None
    try:
        bucket = Bucket(config.store, config.store_endpoint or None)
    except ImportError as exc:
        raise StoreError("--store needs boto3: pip install 'shardcache[s3]'") from exc
    try:
        bucket.check()
    except StoreRefused as exc:
        raise StoreError(f"--store {config.store}: {exc}") from exc
    except StoreUnavailable as exc:
        log.warning(
            "the object store cannot be reached now (%s); local caches serve, and "
            "publishing and pulling retry",
            exc,
        )
    return bucket


class StoreError(RuntimeError):
    """--store names a store that refuses this daemon."""


class CacheServer:
    """A running daemon: start(), then wait() or stop()."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._stream_limits = stream_limits(
            config.max_workers, config.max_streams, config.max_streams_per_client
        )
        self._tls = load_tls(config.tls_cert, config.tls_key, config.tls_client_ca)
        self.authority = Authority(config.auth_file, load_token(config.auth_token_file))
        self._metrics_token = load_token(config.metrics_token_file, "--metrics-token-file")
        if config.metrics_tls and self._tls is None:
            raise SecurityConfigError(
                "--metrics-tls serves /metrics with --tls-cert and --tls-key: pass them too"
            )
        self._lock = DataDirLock(config.data_dir)  # before anything reads or changes the data
        try:
            self._setup(config)
        except BaseException:
            self._lock.release()
            raise

    def _setup(self, config: ServerConfig) -> None:
        capacity = Capacity(config.data_dir, config.max_bytes, config.min_free_bytes)
        self.catalog = Catalog(
            config.data_dir, capacity, open_store(config), pull_all=config.store_pull == "all"
        )
        metrics.watch_disk(capacity.in_use, config.max_bytes)
        self._sweeper = TtlSweeper(self.catalog, config.ttl_sweep_interval)
        self.materializer = Materializer(
            self.catalog,
            tuple(map(str, config.pythonpath)),
            policy=Policy.from_settings(config.materialize_allow, config.allow_shipped_pipelines),
        )
        self.leases = LeaseTable(self.catalog, config.lease_ttl)
        callers = Callers(self.authority)
        self.service = CacheService(
            self.catalog,
            self.materializer,
            self.leases,
            callers,
            report_readers=config.metrics_readers,
        )
        self.health = health.HealthServicer()
        self._disk = DiskWatch(config.data_dir, self._writes_health)
        metrics.DISK_FREE_BYTES.set_function(self._disk.free_bytes)
        options = [
            ("grpc.max_send_message_length", admission.receive_limit(config.max_message_bytes)),
            ("grpc.max_receive_message_length", admission.receive_limit(config.max_message_bytes)),
            ("grpc.so_reuseport", 0),
            # fleet clients ping every few seconds to find a lost link (client/_fleet.py)
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        max_streams, per_client = self._stream_limits
        self._control_pool = futures.ThreadPoolExecutor(
            admission.CONTROL_WORKERS, thread_name_prefix="control"
        )
        self._idle_streams = admission.IdleStreams(config.stream_idle_timeout)
        self._calls = ServerInterceptor(
            callers,
            per_client,
            max_streams=max_streams,
            max_message_bytes=config.max_message_bytes,
            control_pool=self._control_pool,
            idle=self._idle_streams,
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(config.max_workers),
            options=options,
            interceptors=[self._calls],
        )
        pb_grpc.add_CacheServiceServicer_to_server(self.service, self._server)
        # after the generated handlers, to replace theirs for these two methods
        self._server.add_registered_method_handlers(SERVICE_NAME, wire_handlers(self.service))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self.addresses: list[str] = []
        for address in config.listen:
            self.addresses.append(self._bind(normalize_listen(address)))
        self.data_plane: DataPlane | None = None
        if address := data_address(config):
            warn_if_exposed(address, self._tls is not None)
            self.data_plane = DataPlane(
                self.catalog,
                self.leases,
                address,
                self._tls,
                max_streams,
                per_client,
                config.stream_idle_timeout or 3600.0,
            )
            self.service.data_port = self.data_plane.port
        self.metrics_address = ""
        self._stop_metrics = lambda: None
        if config.metrics_listen:
            self.metrics_address, self._stop_metrics = metrics.serve_http(
                config.metrics_listen,
                self._metrics_token,
                self._tls.server_context() if config.metrics_tls and self._tls else None,
            )
        self._stopped = threading.Event()

    def _bind(self, address: str) -> str:
        if address.startswith("unix://"):
            path = Path(address.removeprefix("unix://"))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.is_socket():
                    path.unlink()  # a stale socket from a previous run
            except OSError as exc:
                raise ListenError(
                    f"cannot listen on {address}: cannot make its directory or replace a "
                    f"stale socket there ({exc.strerror}: {exc.filename}); give --listen a "
                    "socket path in a directory the daemon may write"
                ) from exc
        tls = self._tls is not None and not address.startswith("unix://")
        warn_if_exposed(address, tls)
        try:
            if tls:
                assert self._tls is not None
                port = self._server.add_secure_port(address, self._tls.server_credentials())
            else:
                port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ListenError(f"cannot listen on {address}: {exc}") from exc
        if address.startswith("unix://"):
            os.chmod(address.removeprefix("unix://"), self.config.socket_mode)
            return address
        return f"{address.rpartition(':')[0]}:{port}"

    def _writes_health(self, disk_full: bool) -> None:
        self.health.set(
            WRITES_HEALTH_SERVICE,
            health_pb2.HealthCheckResponse.NOT_SERVING
            if disk_full
            else health_pb2.HealthCheckResponse.SERVING,
        )

    def start(self) -> None:
        self._server.start()
        if self.data_plane is not None:
            self.data_plane.start()
        self._sweeper.start()
        self._idle_streams.start()
        self.leases.start()
        self.materializer.resume_interrupted()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving %d caches from %s on %s%s%s",
            len(self.catalog.list()),
            self.config.data_dir,
            ", ".join(self.addresses),
            f"; data plane on {self.data_plane.address}" if self.data_plane else "",
            f"; metrics on http{'s' if self.config.metrics_tls else ''}://"
            f"{self.metrics_address}/metrics"
            if self.metrics_address
            else "",
        )
        self._disk.start()
        self.authority.watch()
        sd_notify("READY=1")

    def stop(self, grace: float | None = None) -> None:
        """Stop taking new calls, let in-flight streams finish (up to grace), exit."""
        if self._stopped.is_set():
            return
        grace = self.config.grace_seconds if grace is None else grace
        sd_notify("STOPPING=1")
        self.health.enter_graceful_shutdown()  # NOT_SERVING: probes steer traffic away
        if self.config.shutdown_delay:
            log.info(
                "health is NOT_SERVING; still serving for %.1fs before draining",
                self.config.shutdown_delay,
            )
            time.sleep(self.config.shutdown_delay)
        log.info("draining in-flight streams (up to %.0fs)", grace)
        self.service.drain()
        self.materializer.shutdown()
        stopped = self._server.stop(grace)
        if self.data_plane is not None:
            self.data_plane.stop(grace)
        stopped.wait()
        if not self._calls.wait_idle(5.0):
            log.warning("some cancelled calls were still unwinding 5s after the drain")
        self.authority.stop()
        self._sweeper.stop()
        self._idle_streams.stop()
        self._control_pool.shutdown(wait=False)
        self._disk.stop()
        self.leases.stop()
        self.catalog.close()
        self._stop_metrics()
        self._lock.release()
        self._stopped.set()
        log.info("stopped")

    def wait(self) -> None:
        self._stopped.wait()

    def run_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT, then drain and return."""

        def handler(signum: int, frame: object) -> None:
            log.info("received %s", signal.Signals(signum).name)
            threading.Thread(target=self.stop, name="shutdown", daemon=True).start()

        def reload(signum: int, frame: object) -> None:
            log.info("received SIGHUP: rereading the credentials")
            threading.Thread(target=self.authority.reload, name="reload", daemon=True).start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, reload)
        self.start()
        while not self._stopped.wait(0.5):
            pass
