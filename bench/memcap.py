"""A memory-limited cgroup: a machine with less RAM, for measuring memory past its size.

Writing more than this machine's RAM takes too long for a benchmark, so the memory section of
``run.py`` gives its processes a smaller machine instead: :class:`MemoryCap` makes a cgroup
with a hard memory limit (cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``; no swap
on this machine) as a child of the cgroup this process is in, and :meth:`MemoryCap.prefix`
is a command prefix that moves the started process into it before it ``exec``s, so that
all of its memory is charged there from the first page. A process that needs more than the
limit is killed by the kernel's OOM killer (SIGKILL), which :meth:`MemoryCap.oom_kills`
counts. The page cache of files a process reads or writes is charged too, but the kernel
reclaims it before it kills anything. Needs root (or a delegated cgroup).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType

_ROOT = Path("/sys/fs/cgroup")


class MemoryCapError(RuntimeError):
    """No memory-limited cgroup can be made on this machine."""


def _own_cgroup() -> tuple[Path, int]:
    """The directory of this process's memory cgroup and the cgroup version (1 or 2)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and (_ROOT / "memory").is_dir():
            return _ROOT / "memory" / path.lstrip("/"), 1
    for line in lines:
        if line.startswith("0::"):
            path = line.split(":", 2)[2].lstrip("/")
            for mount in (_ROOT, _ROOT / "unified"):
                if (mount / "cgroup.controllers").exists() and "memory" in (
                        mount / "cgroup.controllers").read_text().split():
                    return mount / path, 2
    raise MemoryCapError("no cgroup memory controller is mounted under /sys/fs/cgroup")


class MemoryCap:
    """A cgroup whose processes together may use at most ``limit_bytes`` of memory.

    Use as a context manager: on exit the cgroup is removed (its processes must have ended).
    """

    def __init__(self, limit_bytes: int, name: str | None = None) -> None:
        self.limit_bytes = limit_bytes
        parent, self.version = _own_cgroup()
        self.path = parent / (name or f"shardcache-bench-{os.getpid()}")
        try:
            if self.version == 2:
                control = parent / "cgroup.subtree_control"
                if "memory" not in control.read_text().split():
                    control.write_text("+memory\n")
            self.path.mkdir(exist_ok=True)
            limit_file = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
            (self.path / limit_file).write_text(f"{limit_bytes}\n")
            if self.version == 2 and (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0\n")
        except OSError as exc:
            raise MemoryCapError(
                f"cannot make a memory-limited cgroup under {parent} ({exc}): run as root, "
                "on a machine with the cgroup memory controller") from exc
        self._oom_start = self.oom_kills()

    def prefix(self) -> list[str]:
        """Command prefix that joins the cgroup, then ``exec``s the rest (the pid stays)."""
        return ["sh", "-c", f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"', "memcap"]

    def oom_kills(self) -> int:
        """How many processes of the cgroup the OOM killer has killed so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def peak_bytes(self) -> int | None:
        """The cgroup's peak charge (v1; v2 kernels from 5.19), None where not reported."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def describe(self) -> str:
        """One line for the report."""
        limit = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return (f"a cgroup v{self.version} with {limit} = {self.limit_bytes / 2**30:g} GiB "
                "(no swap)")

    def close(self) -> None:
        """Remove the cgroup (ignored while processes are still in it)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def __enter__(self) -> MemoryCap:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
