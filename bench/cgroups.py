"""The cgroups of ``run.py`` (root): a machine with less RAM, a disk of a given read speed.

``MemoryCap``: a child cgroup with a hard memory limit and no swap; :meth:`MemoryCap.prefix`
moves a started process into it before it ``exec``s, so that all its memory is charged there,
and the OOM killer's kills are counted. ``SlowDisk``: this machine's virtual disk is cached by
its host (a "cold" read runs at 0.5-1.9 GB/s), so the run's process tree goes into a block-I/O
cgroup (v1 ``blkio``, v2 ``io``) that limits reads from a disk, page faults on LMDB's map and
read-ahead included, to a real disk's rate; the page cache stays free.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

MB = 1_000_000
_ROOT = Path("/sys/fs/cgroup")
_V1_BLKIO = _ROOT / "blkio"


class MemoryCapError(RuntimeError):
    """No memory-limited cgroup can be made on this machine."""


def _memory_cgroup() -> tuple[Path, int]:
    """The directory of this process's memory cgroup and the cgroup version (1 or 2)."""
    if (_ROOT / "memory").is_dir():
        return _ROOT / "memory" / _cgroup_path("memory"), 1
    for mount in (_ROOT, _ROOT / "unified"):
        if "memory" in _read(mount / "cgroup.controllers").split():
            return mount / _cgroup_path(""), 2
    raise MemoryCapError("no cgroup memory controller is mounted under /sys/fs/cgroup")


class MemoryCap(contextlib.AbstractContextManager["MemoryCap"]):
    """A cgroup whose processes together may use ``limit_bytes`` of memory; removed on exit
    (once its processes have ended)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        parent, self.version = _memory_cgroup()
        self.path = parent / f"shardcache-bench-{os.getpid()}"
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
                "on a machine with the cgroup memory controller"
            ) from exc

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

    def describe(self) -> str:
        limit = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return f"a cgroup v{self.version} with {limit} = {self.limit_bytes / 2**30:g} GiB (no swap)"

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):  # processes still in it keep it
            self.path.rmdir()


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
            "network filesystem?): point --tmp-dir at a directory on a real disk"
        )
    if (sys_dev / "partition").exists():
        number = (sys_dev.resolve().parent / "dev").read_text().strip()
    return number


class SlowDisk:
    """Reads from the disk under ``path`` limited to ``read_mbps`` MB/s for this process tree,
    while in the context; on exit the process moves back and the cgroup is removed."""

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
                "the disk's read speed; run without --disk-read-mbps"
            )
        group = home / f"shardcache-bench-{os.getpid()}"
        try:
            group.mkdir()
            (group / rule[0]).write_text(rule[1] + "\n")
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError as exc:
            if group.exists():
                group.rmdir()
            raise SlowDiskError(
                f"cannot limit reads with {group / rule[0]} (needs root): {exc}"
            ) from exc
        self._group, self._home = group, home
        return self

    def __exit__(self, *exc: object) -> None:
        if self._group is None or self._home is None:
            return
        (self._home / "cgroup.procs").write_text(f"{os.getpid()}\n")
        try:
            self._group.rmdir()  # empty once the run's children have exited
        except OSError as exc:
            print(
                f"warning: cannot remove {self._group} ({exc}): a process the run started "
                "is still in it",
                file=sys.stderr,
            )
        self._group = None


def _cgroup_path(controller: str) -> str:
    """This process's cgroup path (relative) in the hierarchy of controller ("" for v2)."""
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return ""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
