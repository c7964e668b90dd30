"""cacheserver daemons for the benchmarks, through the project's ``DaemonProcess``.

Every bench script that needs a daemon starts it here: ``cacheserver serve`` on a unix
socket, imported from this checkout (or, for an A/B, from another checkout's ``root``),
TensorFlow's log noise off, optionally behind a command ``prefix`` (``memcap.py`` uses one
to start the daemon inside a memory-limited cgroup).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cacheserver.launch import DaemonProcess, DaemonStartError

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

__all__ = ["REPO_ROOT", "BenchDaemon", "DaemonStartError", "child_env"]


def child_env(root: Path = REPO_ROOT, safe_path: bool = False) -> dict[str, str]:
    """Environment for bench subprocesses: quiet TensorFlow, ``root``'s packages imported.

    ``safe_path`` (``PYTHONSAFEPATH``) keeps ``python -m`` from importing the working
    directory's packages first, so that a daemon started for another checkout really runs that
    checkout's code (bench scripts run as files need their own directory on the path: not
    for them).
    """
    env = os.environ.copy()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if safe_path:
        env["PYTHONSAFEPATH"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


class BenchDaemon(DaemonProcess):
    """``cacheserver serve --data-dir DATA_DIR --listen unix://SOCKET`` for a benchmark."""

    def __init__(self, data_dir: Path, socket_path: Path, log_path: Path,
                 extra_args: Sequence[str] = (), root: Path = REPO_ROOT,
                 prefix: Sequence[str] = ()) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(data_dir, ["unix://" + str(socket_path)], log_path,
                         extra_args=extra_args, env=child_env(root, safe_path=True))
        self.socket_path = socket_path
        self.root = root
        self.prefix = tuple(prefix)

    @property
    def address(self) -> str:
        """The daemon's gRPC target."""
        return self.target

    @property
    def pid(self) -> int:
        """The daemon's process id (it must have been started)."""
        assert self.proc is not None, "the daemon was never started"
        return self.proc.pid

    @property
    def command(self) -> list[str]:
        """``serve``'s command line behind the prefix (which must ``exec`` it, keeping the pid)."""
        return [*self.prefix, *super().command]
