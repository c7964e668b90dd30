"""How a bench runs: the checkout it imports, its daemons, its child processes, its options
and JSON output. ``probes.py`` records the machine and a process's memory and CPU,
``timing.py`` times epochs and fills the tables."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
#: The checkout whose packages a bench process imports: this one, or in a child process of
#: an A/B, the other checkout's (``child_env`` names it).
ROOT_ENV = "SHARDCACHE_BENCH_ROOT"
sys.path.insert(1, os.environ.get(ROOT_ENV, str(REPO_ROOT)))  # after the script's own folder
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process's TensorFlow and its children's

from cacheserver.launch import DaemonProcess  # noqa: E402

if TYPE_CHECKING:
    from tests.fleet import NetnsLink

MB, GB, GIB = 1_000_000, 1_000_000_000, 1 << 30
RESULT_PREFIX = "RESULT "


# ---------------------------------------------------------------------- daemons
def child_env(root: Path = REPO_ROOT, safe_path: bool = False) -> dict[str, str]:
    """Environment for bench subprocesses that import ``root``'s packages.

    ``safe_path`` keeps ``python -m`` from importing the working directory's packages first,
    so that a daemon of another checkout runs that checkout's code.
    """
    env = os.environ.copy()
    env[ROOT_ENV] = str(root)
    if safe_path:
        env["PYTHONSAFEPATH"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (free until someone binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class BenchDaemon(DaemonProcess):
    """``cacheserver serve`` on a unix socket named ``name`` in ``directory`` (a short path:
    a socket's path holds at most 107 bytes), its data dir in ``data_root`` (default: the same).

    ``target`` is the unix socket: a client there reads over gRPC (or the shard files, with
    ``direct=True``). ``tcp`` also listens on a free 127.0.0.1 port, ``tcp_target``: a client
    there is remote, and reads over the daemon's data plane (``--data-listen auto``: another
    free port on that host) unless ``$SHARDCACHE_DATA_PLANE=off``; ``host`` is its address
    (a network namespace's, with that namespace's ``prefix``). ``root`` runs another
    checkout's daemon; ``prefix`` must ``exec`` the command, keeping the pid
    (``cgroups.MemoryCap.prefix``).
    """

    def __init__(
        self,
        directory: Path,
        name: str,
        extra_args: Sequence[str] = (),
        root: Path = REPO_ROOT,
        prefix: Sequence[str] = (),
        data_root: Path | None = None,
        tcp: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        data_dir = (data_root or directory) / f"data-{name}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.tcp_target = f"{host}:{free_port()}" if tcp else None
        super().__init__(
            data_dir,
            [f"unix://{directory / name}.sock", *filter(None, [self.tcp_target])],
            (data_root or directory) / f"{name}.log",
            extra_args=extra_args,
            env=child_env(root, safe_path=True),
        )
        self.socket_path = directory / f"{name}.sock"
        self.root = root
        self.prefix = tuple(prefix)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the daemon was never started"
        return self.proc.pid

    @property
    def command(self) -> list[str]:
        return [*self.prefix, *super().command]

    def delete_cache(self, name: str) -> None:
        """Delete a measured cache, so that the disk holds one at a time."""
        from client import CacheClient

        with CacheClient(self.target) as cc:
            cc.delete(name)


def linked_daemon(directory: Path, name: str, link: NetnsLink | None) -> tuple[BenchDaemon, str]:
    """A daemon (not started) with a TCP address and ``--metrics-listen``, inside link's
    network namespace (reached across its veth pair), or on loopback without one; and its
    metrics HOST:PORT."""
    host = link.host if link is not None else "127.0.0.1"
    metrics = f"{host}:{free_port()}"
    return BenchDaemon(
        directory,
        name,
        tcp=True,
        host=host,
        prefix=link.prefix if link is not None else (),
        extra_args=("--metrics-listen", metrics),
    ), metrics


# ---------------------------------------------------------------------- child processes
def print_result(record: dict[str, Any]) -> None:
    """A child's answer: one ``RESULT`` line of JSON on stdout (the rest is noise)."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(record, default=str) + "\n")
    sys.stdout.flush()


def read_result(line: str) -> dict[str, Any] | None:
    """The record of a ``RESULT`` line, None for any other line."""
    return json.loads(line[len(RESULT_PREFIX) :]) if line.startswith(RESULT_PREFIX) else None


def server_process(script: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """``script --serve ...`` in a process of its own (a bench's server), and the port it
    prints as its first line (0: it printed none)."""
    proc = subprocess.Popen(
        [sys.executable, script, "--serve", *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline() or 0)


def run_child(
    cmd: Sequence[str],
    root: Path = REPO_ROOT,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` with ``root``'s packages; its last ``RESULT`` record, or RuntimeError."""
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=root,
            env=child_env(root),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"timed out after {timeout_s:g} s") from exc
    results = [r for r in map(read_result, proc.stdout.splitlines()) if r is not None]
    if not results:
        killed = f" (killed by signal {-proc.returncode})" if proc.returncode < 0 else ""
        tail = " ".join(proc.stderr[-800:].split())
        raise RuntimeError(f"exit code {proc.returncode}{killed}, no result: {tail}")
    return results[-1]


# ---------------------------------------------------------------------- command lines, output
def arguments(
    doc: str | None, baseline: bool = False, out: bool = False, repeat: int | None = None
) -> argparse.ArgumentParser:
    """An entry point's parser, its docstring the description, with the options the entry
    points share: ``--baseline-root``, ``--out`` and ``--repeat`` (its default)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if baseline:
        parser.add_argument(
            "--baseline-root",
            type=Path,
            default=None,
            metavar="DIR",
            help="another checkout, measured beside this one in the same run",
        )
    if out:
        parser.add_argument("--out", type=Path, help="write the raw numbers here (JSON)")
    if repeat is not None:
        parser.add_argument(
            "--repeat",
            type=int,
            default=repeat,
            help=f"runs of each measurement (default {repeat})",
        )
    return parser


def write_json(path: Path | None, payload: object) -> None:
    """Write ``payload`` to ``path`` (if any) as JSON, and say so on stderr."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"raw results written to {path}", file=sys.stderr)
