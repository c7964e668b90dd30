"""A real cacheserver process for tests: started on a unix socket and a free TCP port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from cacheserver.probe import NotHealthy, wait_healthy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """`cacheserver serve` as a child process; data survives restarts."""

    def __init__(self, data_dir: Path | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
        self.data_dir = data_dir or self._tmp / "data"
        self.socket = self._tmp / "d.sock"
        self.unix_target = f"unix://{self.socket}"
        self.port = free_port()
        self.tcp_target = f"127.0.0.1:{self.port}"
        self.extra_args = extra_args
        self.log_path = self._tmp / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "cacheserver", "serve", "--data-dir", str(self.data_dir),
                "--listen", self.unix_target, "--listen", self.tcp_target, *self.extra_args]

    def start(self) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        proc = self.proc
        try:
            wait_healthy(self.unix_target, still_starting=lambda: proc.poll() is None)
        except NotHealthy:
            self.kill()
            raise RuntimeError(f"daemon did not start:\n{self.log()}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def restart(self) -> Daemon:
        self.kill()
        return self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self._tmp, ignore_errors=True)


def env_without_tf_noise() -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env
