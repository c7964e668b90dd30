"""Worker processes of a TF_CONFIG cluster on loopback, for the multi-worker tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from daemon import env_without_tf_noise, free_port


@contextlib.contextmanager
def workers(
    argvs: Sequence[Sequence[str]], logs: Sequence[Path], env: dict[str, str] | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A Python process per argv, its output appended to its log; with more than one, each
    gets TF_CONFIG naming it a worker of one cluster on free loopback ports. Whatever is
    still running when the block ends is killed (a dead peer would leave the others waiting
    in a collective)."""
    ports = [free_port() for _ in argvs]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank, (argv, log) in enumerate(zip(argvs, logs, strict=True)):
            worker_env = {**env_without_tf_noise(), **(env or {})}
            if len(argvs) > 1:
                worker_env["TF_CONFIG"] = json.dumps(
                    {
                        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                        "task": {"type": "worker", "index": rank},
                    }
                )
            with log.open("ab") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *argv],
                        env=worker_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def wait_all(procs: Sequence[subprocess.Popen[bytes]], deadline: float) -> str | None:
    """Wait for every process until deadline (time.monotonic()); the reason to fail, or None
    when all exited 0."""
    running = list(procs)
    while running:
        for proc in list(running):
            try:
                rc = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            running.remove(proc)
            if rc != 0:
                return f"worker {procs.index(proc)} exited with {rc}"
        if time.monotonic() > deadline:
            return "workers still running past their deadline"
    return None
