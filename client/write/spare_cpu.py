"""Whether a write epoch may compress: only with CPU to spare.

A write epoch compresses (zstd) beside the source pipeline. With a core to
spare that is free; when the pipeline keeps every core the process may use
busy, each CPU second of compression lengthens the epoch (docs/writing.md,
"What a write epoch costs"). :class:`SpareCpu` measures, over windows of at
least WINDOW_S, the idle time of the CPUs this process may run on
(``/proc/stat``, the CPUs of its affinity mask) and, under a cgroup v2 CPU
limit (a Kubernetes pod's ``limits.cpu``), what the cgroup's quota leaves
unused. :class:`CompressGate` turns that into a decision per slice of records
for :class:`client.write.write_behind.WriteBehind`: compressing goes on while
some CPU stays idle beside it; once none does, records are stored raw until
the idle CPU would cover what compressing took. It is used when
$SHARDCACHE_COMPRESS is "spare-cpu"; by default ("always") every slice is
compressed whatever the load (docs/writing.md says what each choice costs).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from client import settings

#: Compressing goes on while at least this many cores' worth of CPU stays idle beside it.
KEEP_CORES = 0.1
#: The shortest window idle time is measured over (/proc/stat counts 10 ms ticks per CPU).
WINDOW_S = 0.2


def compress_mode() -> str:
    """$SHARDCACHE_COMPRESS, checked: "always" or "spare-cpu"."""
    return settings.COMPRESS.get()


@dataclass(frozen=True)
class Sample:
    """CPU time counters at one moment, in seconds."""

    wall: float
    idle: float  # idle + iowait of the CPUs the process may use (or an estimate)
    cgroup_used: float | None  # the cgroup's usage, when it has a CPU quota


class SpareCpu:
    """Idle cores available to this process over the last window; not thread-safe.

    proc and cgroup name the /proc and cgroup v2 roots. Where /proc/stat cannot
    be read (not Linux), the idle time is estimated as the CPUs the process may
    use less its own CPU time.
    """

    def __init__(self, proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> None:
        self._proc = proc
        self._cpus = _allowed_cpus()
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._cgroup, self._quota = _cgroup_quota(proc, cgroup)
        self._last = self._sample()

    def window(self) -> tuple[float, float] | None:
        """(idle cores on average, seconds) of the window that ends now, or None while
        the window is shorter than WINDOW_S."""
        now = self._sample()
        wall = now.wall - self._last.wall
        if wall < WINDOW_S:
            return None
        spare, self._last = spare_between(self._last, now, self._quota), now
        return spare, wall

    def _sample(self) -> Sample:
        wall = time.monotonic()
        idle = self._idle_seconds()
        if idle is None:  # no /proc/stat: the allowed CPUs' time less this process's
            times = os.times()
            idle = len(self._cpus) * wall - (times.user + times.system)
        used = None
        if self._cgroup is not None:
            used = _cgroup_usage(self._cgroup)
        return Sample(wall, idle, used)

    def _idle_seconds(self) -> float | None:
        try:
            text = (self._proc / "stat").read_text(encoding="ascii")
        except OSError:
            return None
        return idle_ticks(text, self._cpus) / self._tick


class CompressGate:
    """Whether to compress the next slice of records, from SpareCpu's windows; one per
    write, used from one thread.

    It starts compressing. While compressing, it goes on as long as at least
    KEEP_CORES stayed idle in the last window; otherwise compression competed
    with the pipeline, and the next slices are stored raw. While storing raw,
    it compresses again once the idle CPU covers what packing with compression
    took (cores, measured by packed()) plus KEEP_CORES.
    """

    def __init__(self, cpu: SpareCpu) -> None:
        self._cpu = cpu
        self.on = True
        self._need = 0.0  # cores packing took in the last window spent compressing
        self._packing = 0.0  # CPU seconds packing took in the current window

    def packed(self, cpu_seconds: float) -> None:
        """Count the CPU time one slice's packing took (compressed or raw)."""
        self._packing += cpu_seconds

    def compress(self) -> bool:
        window = self._cpu.window()
        if window is not None:
            idle, wall = window
            if self.on:
                self._need = self._packing / wall
                self.on = idle >= KEEP_CORES
            else:
                self.on = idle >= self._need + KEEP_CORES
            self._packing = 0.0
        return self.on


def spare_between(a: Sample, b: Sample, quota: float | None) -> float:
    """Idle cores between two samples: the CPUs' idle time over the wall time, and no more
    than the cgroup's quota (cores) leaves unused."""
    wall = b.wall - a.wall
    spare = max(b.idle - a.idle, 0.0) / wall
    if quota is not None and a.cgroup_used is not None and b.cgroup_used is not None:
        spare = min(spare, quota - (b.cgroup_used - a.cgroup_used) / wall)
    return max(spare, 0.0)


def idle_ticks(stat: str, cpus: set[int]) -> int:
    """idle + iowait ticks of the CPUs in cpus, from /proc/stat's text."""
    total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            fields = rest.split()
            total += int(fields[3]) + int(fields[4])  # user nice system IDLE IOWAIT ...
    return total


def _allowed_cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _cgroup_quota(proc: Path, root: Path) -> tuple[Path | None, float | None]:
    """This process's cgroup v2 directory and its CPU quota in cores, or (None, None) when
    it has none (cpu.max "max ...", cgroup v1, not Linux)."""
    try:
        lines = (proc / "self" / "cgroup").read_text(encoding="utf-8").splitlines()
        path = next(line[3:] for line in lines if line.startswith("0::"))
        directory = root / path.lstrip("/")
        quota, period = (directory / "cpu.max").read_text(encoding="ascii").split()[:2]
    except (OSError, StopIteration, ValueError):
        return None, None
    if quota == "max":
        return None, None
    return directory, int(quota) / int(period)


def _cgroup_usage(directory: Path) -> float | None:
    try:
        for line in (directory / "cpu.stat").read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None
