"""A real cacheserver process for tests: started on a unix socket and a free TCP port."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from cacheserver.launch import DaemonProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon(DaemonProcess):
    """`cacheserver serve` in a temp dir of its own; data survives restarts."""

    def __init__(
        self,
        data_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
        self.socket = self._tmp / "d.sock"
        self.unix_target = f"unix://{self.socket}"
        self.port = port or free_port()
        self.tcp_target = f"{host}:{self.port}"
        super().__init__(
            data_dir or self._tmp / "data",
            (self.unix_target, self.tcp_target),
            self._tmp / "daemon.log",
            extra_args,
            env,
        )

    def restart(self) -> Daemon:
        self.kill()
        self.start()
        return self

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self._tmp, ignore_errors=True)


def env_without_tf_noise() -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env
