"""The daemon process: gRPC server, health, reflection, listeners, graceful stop."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cacheserver.catalog import Catalog
from cacheserver.materializer import Materializer
from cacheserver.service import CacheService
from cacheserver.v1 import cache_service_pb2 as pb
from cacheserver.v1 import cache_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CacheService"].full_name
DEFAULT_LISTEN = "127.0.0.1:50051"
#: Messages carry chunks of ~1 MiB, but one record may be larger than that.
MAX_MESSAGE_BYTES = 256 << 20


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


class ListenError(ValueError):
    """A --listen address is malformed or cannot be bound."""


@dataclass
class ServerConfig:
    data_dir: Path
    listen: list[str] = field(default_factory=lambda: [DEFAULT_LISTEN])
    grace_seconds: float = 30.0
    max_workers: int = 64
    #: Directories materialization workers import entry points from (--pythonpath).
    pythonpath: list[Path] = field(default_factory=list)


def normalize_listen(address: str) -> str:
    """Check a --listen address: 'host:port' or 'unix:///absolute/path'."""
    if address.startswith("unix:"):
        path = address.removeprefix("unix://") if address.startswith("unix://") \
            else address.removeprefix("unix:")
        if not path.startswith("/"):
            raise ListenError(f"--listen {address!r}: a unix socket needs an absolute path, "
                              "as in unix:///run/cacheserver/cacheserver.sock")
        return f"unix://{path}"
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(f"--listen {address!r}: expected HOST:PORT (e.g. 127.0.0.1:50051) "
                          "or unix:///path/to.sock")
    return address


class CacheServer:
    """A running daemon: start(), then wait() or stop()."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(config.data_dir)
        self.materializer = Materializer(self.catalog, tuple(map(str, config.pythonpath)))
        self.service = CacheService(self.catalog, self.materializer)
        self.health = health.HealthServicer()
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        self._server = grpc.server(futures.ThreadPoolExecutor(config.max_workers),
                                   options=options)
        pb_grpc.add_CacheServiceServicer_to_server(self.service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
        self.addresses: list[str] = []
        for address in config.listen:
            self.addresses.append(self._bind(normalize_listen(address)))
        self._stopped = threading.Event()

    def _bind(self, address: str) -> str:
        if address.startswith("unix://"):
            path = Path(address.removeprefix("unix://"))
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_socket():
                path.unlink()  # a stale socket from a previous run
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ListenError(f"cannot listen on {address}: {exc}") from exc
        if address.startswith("unix://"):
            os.chmod(address.removeprefix("unix://"), 0o660)
            return address
        return f"{address.rpartition(':')[0]}:{port}"

    def start(self) -> None:
        self._server.start()
        self.materializer.resume_interrupted()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving %d caches from %s on %s", len(self.catalog.list()),
                 self.config.data_dir, ", ".join(self.addresses))
        sd_notify("READY=1")

    def stop(self, grace: float | None = None) -> None:
        """Stop taking new calls, let in-flight streams finish (up to grace), exit."""
        if self._stopped.is_set():
            return
        grace = self.config.grace_seconds if grace is None else grace
        sd_notify("STOPPING=1")
        log.info("draining in-flight streams (up to %.0fs)", grace)
        self.health.enter_graceful_shutdown()
        self.service.drain()
        self.materializer.shutdown()
        self._server.stop(grace).wait()
        self._stopped.set()
        log.info("stopped")

    def wait(self) -> None:
        self._stopped.wait()

    def run_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT, then drain and return."""
        def handler(signum: int, frame: object) -> None:
            log.info("received %s", signal.Signals(signum).name)
            threading.Thread(target=self.stop, name="shutdown", daemon=True).start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        self.start()
        while not self._stopped.wait(0.5):
            pass
