"""A daemon as a child process, and waiting for one the way a kubelet probe does.

:class:`DaemonProcess` runs ``cacheserver serve`` as a child (the demo, the
tests and the benchmarks all start their daemons through it), and
:func:`wait_healthy` polls gRPC health checks until the daemon answers SERVING.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class NotHealthy(TimeoutError):
    """The daemon did not answer SERVING in time."""


def wait_healthy(
    target: str, deadline_s: float = 30.0, still_starting: Callable[[], bool] = lambda: True
) -> None:
    """Block until the daemon at target answers SERVING to a health check.

    still_starting is polled between attempts; returning False (the process
    exited, say) stops the wait at once with NotHealthy.
    """
    deadline = time.monotonic() + deadline_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if not still_starting():
                raise NotHealthy(f"the daemon at {target} stopped while starting")
            try:
                reply = stub.Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0, wait_for_ready=True
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise NotHealthy(f"the daemon at {target} was not healthy within {deadline_s:g}s")
            time.sleep(0.05)


class DaemonStartError(RuntimeError):
    """The daemon exited or stayed unhealthy while starting; the message holds its log."""


class DaemonProcess:
    """``cacheserver serve --data-dir DATA_DIR --listen ...`` as a child process.

    Its output goes to log_path. start() returns once the first listen address
    answers SERVING to a health check; stop() sends SIGTERM (the daemon drains
    its streams) and kills it if it has not exited after timeout_s. The data dir
    survives a stop, so the same object can start again over the same caches.
    new_session puts the daemon in a process group of its own, so that Ctrl-C
    in a terminal reaches only the parent, which then stops the daemon itself.
    """

    def __init__(
        self,
        data_dir: Path,
        listen: Sequence[str],
        log_path: Path,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        if not listen:
            raise ValueError("a daemon needs at least one listen address")
        self.data_dir = data_dir
        self.listen = tuple(listen)
        self.log_path = log_path
        self.extra_args = tuple(extra_args)
        self.env = dict(env) if env is not None else None
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """The first listen address: where start() checks health."""
        return self.listen[0]

    @property
    def command(self) -> list[str]:
        listen = [arg for address in self.listen for arg in ("--listen", address)]
        return [
            sys.executable,
            "-m",
            "cacheserver",
            "serve",
            "--data-dir",
            str(self.data_dir),
            *listen,
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 60.0) -> DaemonProcess:
        """Start the daemon; return once it is healthy, else raise DaemonStartError."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=self.new_session,
            )
        proc = self.proc
        try:
            wait_healthy(self.target, timeout_s, still_starting=lambda: proc.poll() is None)
        except NotHealthy as exc:
            self.kill()
            raise DaemonStartError(
                f"{exc} (exit status {proc.returncode}); its log "
                f"({self.log_path}):\n{self.log_tail()}"
            ) from None
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log().splitlines()[-lines:]) or "(no log)"

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait (subprocess.TimeoutExpired past timeout_s); the exit code."""
        assert self.proc is not None, "the daemon was never started"
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, SIGKILL if it has not exited after timeout_s; the exit code (None: never
        started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.terminate(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would end it; waits for the process to go."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
