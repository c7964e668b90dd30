"""The cgroups of ``run.py``: a machine with less RAM, and a disk of a stated read speed.

**MemoryCap.** Writing more than this machine's RAM takes too long for a benchmark, so the
memory section gives its processes a smaller machine instead: a cgroup with a hard memory
limit (cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``; no swap on this machine) as
a child of the cgroup this process is in. :meth:`MemoryCap.prefix` is a command prefix that
moves the started process into it before it ``exec``s, so that all of its memory is charged
there from the first page. A process that needs more than the limit is killed by the
kernel's OOM killer (SIGKILL), which :meth:`MemoryCap.oom_kills` counts. The page cache of
files a process reads or writes is charged too, but the kernel reclaims it first.

**SlowDisk.** This machine's disk is a virtual one that its host caches: right after the
page cache is dropped, a plain sequential read still runs at 0.5-1.9 GB/s, so a "cold" epoch
costs little more than a warm one and fewer bytes on disk (compression) cannot show.
:class:`SlowDisk` puts the benchmark process, and with it every process it starts, into a
block-I/O cgroup that limits reads from the disk holding a directory to ``read_mbps`` MB/s:
the speed of a real disk (a cloud SSD volume reads 125-1,000 MB/s, a SATA SSD ~500, a local
NVMe drive several GB/s). Writes are not limited. The limit applies where the kernel issues
the read: plain ``read()``, page faults on a memory map (LMDB) and read-ahead all count;
pages already in the page cache are free. It needs the blkio controller of cgroup v1
(``blkio.throttle.read_bps_device``) or the io controller of cgroup v2 (``io.max``).

Both need root (or a delegated cgroup).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from types import TracebackType

MB = 1_000_000
_ROOT = Path("/sys/fs/cgroup")
_V1_BLKIO = _ROOT / "blkio"


class MemoryCapError(RuntimeError):
    """No memory-limited cgroup can be made on this machine."""


def _memory_cgroup() -> tuple[Path, int]:
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
        parent, self.version = _memory_cgroup()
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


class SlowDiskError(RuntimeError):
    """The read limit cannot be set up on this machine."""


def whole_disk(path: Path) -> str:
    """``MAJOR:MINOR`` of the disk holding path (a partition's parent disk: limits are per disk)."""
    dev = os.stat(path).st_dev
    number = f"{os.major(dev)}:{os.minor(dev)}"
    sys_dev = Path("/sys/dev/block") / number
    if not sys_dev.exists():
        raise SlowDiskError(
            f"{path} is on device {number}, which is not a block device (tmpfs, overlay or a "
            "network filesystem?): point --tmp-dir at a directory on a real disk")
    if (sys_dev / "partition").exists():
        number = (sys_dev.resolve().parent / "dev").read_text().strip()
    return number


class SlowDisk:
    """Limit reads from the disk under ``path`` to ``read_mbps`` MB/s, for this process tree.

    Use as a context manager around the whole run; on exit the process moves
    back to the cgroup it came from and the limit's cgroup is removed.
    """

    def __init__(self, path: Path, read_mbps: float) -> None:
        if read_mbps <= 0:
            raise SlowDiskError(f"the read limit must be positive MB/s, not {read_mbps}")
        self.device = whole_disk(path)
        self.read_mbps = read_mbps
        self._group: Path | None = None
        self._home: Path | None = None

    def describe(self) -> str:
        return f"reads from disk {self.device} limited to {self.read_mbps:,.0f} MB/s (cgroup)"

    def __enter__(self) -> SlowDisk:
        rate = int(self.read_mbps * MB)
        if (_V1_BLKIO / "blkio.throttle.read_bps_device").exists():
            home = _V1_BLKIO / _cgroup_path("blkio")
            rule = ("blkio.throttle.read_bps_device", f"{self.device} {rate}")
        elif "io" in _read(_ROOT / "cgroup.controllers").split():
            home = _ROOT / _cgroup_path("")
            rule = ("io.max", f"{self.device} rbps={rate}")
        else:
            raise SlowDiskError(
                "no block-I/O cgroup controller here (cgroup v1 blkio or v2 io): cannot limit "
                "the disk's read speed; run without --disk-read-mbps")
        group = home / f"shardcache-bench-{os.getpid()}"
        try:
            group.mkdir()
            (group / rule[0]).write_text(rule[1] + "\n")
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError as exc:
            if group.exists():
                group.rmdir()
            raise SlowDiskError(f"cannot limit reads with {group / rule[0]} (needs root): "
                                f"{exc}") from exc
        self._group, self._home = group, home
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._group is None or self._home is None:
            return
        (self._home / "cgroup.procs").write_text(f"{os.getpid()}\n")
        try:
            self._group.rmdir()  # empty once the run's children have exited
        except OSError as exc:
            print(f"warning: cannot remove {self._group} ({exc}): a process the run started "
                  "is still in it", file=sys.stderr)
        self._group = None


def _cgroup_path(controller: str) -> str:
    """This process's cgroup path (relative) in the hierarchy of controller ("" for v2)."""
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or controllers == controller:
            return path.lstrip("/")
    return ""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
