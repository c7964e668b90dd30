"""What a measurement records beside its times: the machine, the command, and a process's
anonymous memory and CPU seconds read from ``/proc``; the page cache dropped, disk use."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import inputs
from harness import MB, REPO_ROOT


# ---------------------------------------------------------------------- machine facts
def _first_line(path: str, prefix: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return f"{importlib.metadata.version(name)} ({name})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def git_revision(root: Path = REPO_ROOT) -> str | None:
    """Short hash of HEAD, with a note when tracked files differ from it."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + (" (uncommitted changes)" if dirty else "")


def disk_facts(path: Path) -> dict[str, Any]:
    """The filesystem and block device holding ``path``: type, device, size, rotational."""
    path = path.resolve()
    best: tuple[str, str, str] | None = None
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            device, mount_point, fs_type = line.split()[:3]
            inside = path == Path(mount_point) or Path(mount_point) in path.parents
            if inside and (best is None or len(mount_point) >= len(best[1])):
                best = (device, mount_point, fs_type)
    stat = os.statvfs(path)
    facts: dict[str, Any] = {
        "path": str(path),
        "device": best[0] if best else None,
        "mount_point": best[1] if best else None,
        "filesystem": best[2] if best else None,
        "size_gb": round(stat.f_blocks * stat.f_frsize / 1e9),
        "rotational": None,
    }
    dev = os.stat(path).st_dev
    sys_dev = Path("/sys/dev/block") / f"{os.major(dev)}:{os.minor(dev)}"
    if (sys_dev / "partition").exists():
        sys_dev = sys_dev.resolve().parent
    with contextlib.suppress(OSError):
        facts["rotational"] = (sys_dev / "queue" / "rotational").read_text().strip() == "1"
    return facts


def machine_facts(tmp_dir: Path | None = None) -> dict[str, Any]:
    """The machine and software the numbers depend on; ``tmp_dir``'s disk holds the caches."""
    mem_total = _first_line("/proc/meminfo", "MemTotal:")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _first_line("/proc/cpuinfo", "model name"),
        "mem_total_gib": round(int(mem_total.split()[0]) / 2**20, 1) if mem_total else None,
        "disk": disk_facts(tmp_dir or Path(tempfile.gettempdir())),
        "python": platform.python_version(),
        "tensorflow": _dist_version("tensorflow", "tensorflow-cpu"),
        "numpy": _dist_version("numpy"),
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "date": datetime.date.today().isoformat(),
        "inputs": inputs.digests(REPO_ROOT),
    }


def reproducing_command() -> str:
    """This run's command line, paths relative to the repository root where they can be."""

    def rel(path: str) -> str:
        try:
            return str(Path(path).absolute().relative_to(REPO_ROOT))
        except ValueError:
            return path

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


def run_line() -> str:
    """What a printed table opens with: its command, the cores it had, how busy they were."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"`{reproducing_command()}`: {len(os.sched_getaffinity(0))} core(s), load average "
        f"{load} (1/5/15 min), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} UTC\n"
    )


# ---------------------------------------------------------------------- process probes
def rss_anon_kib(pid: int | str = "self") -> int:
    """``RssAnon`` of ``pid`` in KiB (file-backed pages do not count); 0 once it is gone."""
    value = _first_line(f"/proc/{pid}/status", "RssAnon:")
    return int(value.split()[0]) if value else 0


class RssSampler:
    """A thread sampling a process's ``RssAnon`` every 20 ms: the peak over its life, and over
    a window that :meth:`reset_window` restarts (an epoch's)."""

    def __init__(self, pid: int | str = "self", interval_s: float = 0.02) -> None:
        self._pid = pid
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_anon_kib = 0
        self.window_anon_kib = 0

    def start(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> int:
        """Sample now: the current ``RssAnon`` in KiB."""
        anon = rss_anon_kib(self._pid)
        self.peak_anon_kib = max(self.peak_anon_kib, anon)
        self.window_anon_kib = max(self.window_anon_kib, anon)
        return anon

    def reset_window(self) -> None:
        self.window_anon_kib = 0
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()


def kib_to_mb(kib: int) -> float:
    """KiB (as ``/proc`` reports) in decimal MB."""
    return kib * 1024 / MB


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process so far, all its threads: this process's from
    getrusage (microseconds), another's from ``/proc/<pid>/stat`` (clock ticks)."""
    if pid == "self":
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def directory_bytes(path: Path) -> int:
    """Disk space allocated to the regular files below ``path`` (sparse files count as used)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def drop_page_cache() -> None:
    """Evict clean file pages from memory, so that the next reads come from the disk (root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")
    except OSError as exc:
        raise PermissionError(
            f"a cold read needs to write /proc/sys/vm/drop_caches (root): {exc}"
        ) from exc
