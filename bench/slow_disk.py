"""A disk of a stated read speed, for cold epochs that read from a disk, not a host's cache.

This machine's disk is a virtual one that its host caches: right after the
page cache is dropped, a plain sequential read still runs at 0.5-1.9 GB/s, so
a "cold" epoch costs little more than a warm one and fewer bytes on disk
(compression) cannot show. :class:`SlowDisk` puts the benchmark process, and
with it every process it starts (measurements, daemons), into a block-I/O
cgroup that limits reads from the disk holding a directory to ``read_mbps``
MB/s: the speed of a real disk (a cloud SSD volume reads 125-1,000 MB/s, a
SATA SSD ~500, a local NVMe drive several GB/s). Writes are not limited.

The limit applies where the kernel issues the read: plain ``read()``, page
faults on a memory map (LMDB) and ``posix_fadvise(WILLNEED)`` read-ahead all
count; pages already in the page cache are free. It needs root and the blkio
controller of cgroup v1 (``blkio.throttle.read_bps_device``) or the io
controller of cgroup v2 (``io.max``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType

MB = 1_000_000
_V1 = Path("/sys/fs/cgroup/blkio")
_V2 = Path("/sys/fs/cgroup")


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
        if (_V1 / "blkio.throttle.read_bps_device").exists():
            home = _V1 / _own_cgroup("blkio")
            rule = ("blkio.throttle.read_bps_device", f"{self.device} {rate}")
        elif "io" in _read(_V2 / "cgroup.controllers").split():
            home = _V2 / _own_cgroup("")
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


def _own_cgroup(controller: str) -> str:
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
