"""Facts about the machine, the software and the revision that a benchmark's numbers depend on."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


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


def git_revision() -> str | None:
    """Short hash of HEAD, with a note when tracked files differ from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + (" (uncommitted changes)" if dirty else "")


def disk_facts(path: Path) -> dict[str, Any]:
    """The filesystem and block device holding ``path``: type, device, size, rotational."""
    path = path.resolve()
    best: tuple[str, str, str] | None = None
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                device, mount_point, fs_type = line.split()[:3]
                inside = path == Path(mount_point) or Path(mount_point) in path.parents
                if inside and (best is None or len(mount_point) >= len(best[1])):
                    best = (device, mount_point, fs_type)
    except OSError:
        pass
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
    """Facts about the machine and software that the numbers depend on.

    ``tmp_dir`` (default: the system temp dir) is where the cache files go: its disk is named.
    """
    import tempfile

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
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def reproducing_command() -> str:
    """Return this run's command line, paths relative to the repository root if possible."""

    def rel(path: str) -> str:
        try:
            return str(Path(path).absolute().relative_to(REPO_ROOT))
        except ValueError:
            return path

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])
