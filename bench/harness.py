"""What every bench entry point shares: daemons, machine facts, process probes, timing, tables.

- ``BenchDaemon``: ``cacheserver serve`` on a unix socket through the project's
  ``DaemonProcess``, from this checkout or another's ``root`` (an A/B), optionally behind a
  command ``prefix`` (``cgroups.MemoryCap`` starts it inside a memory-limited cgroup);
- ``machine_facts``, ``reproducing_command``: what a figure's numbers depend on;
- ``RssSampler``, ``cpu_seconds``, ``drop_page_cache``, ``directory_bytes``: what a process
  uses, read from ``/proc``;
- ``timed_iteration``: one epoch of a batched dataset, timed to its last batch;
- ``run_child``/``print_result``: a measurement in a process of its own, its one ``RESULT``
  line back;
- ``markdown_table``, ``ratio``: the tables every script prints.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
#: The checkout whose packages a bench process imports: this one, or in a child process of
#: an A/B, the other checkout's (``child_env`` names it).
ROOT_ENV = "SHARDCACHE_BENCH_ROOT"
sys.path.insert(1, os.environ.get(ROOT_ENV, str(REPO_ROOT)))  # after the script's own folder

from cacheserver.launch import DaemonProcess  # noqa: E402

if TYPE_CHECKING:
    import tensorflow as tf

MB, GB, GIB = 1_000_000, 1_000_000_000, 1 << 30
RESULT_PREFIX = "RESULT "


# ---------------------------------------------------------------------- daemons
def child_env(root: Path = REPO_ROOT, safe_path: bool = False) -> dict[str, str]:
    """Environment for bench subprocesses: quiet TensorFlow, ``root``'s packages imported.

    ``safe_path`` (``PYTHONSAFEPATH``) keeps ``python -m`` from importing the working
    directory's packages first, so that a daemon started for another checkout really runs that
    checkout's code (bench scripts run as files need their own directory on the path: not
    for them).
    """
    env = os.environ.copy()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env[ROOT_ENV] = str(root)
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

    @classmethod
    def in_dir(cls, directory: Path, name: str, extra_args: Sequence[str] = (),
               root: Path = REPO_ROOT, prefix: Sequence[str] = ()) -> BenchDaemon:
        """A daemon (not started) with its data dir, socket and log named ``name`` in directory.

        The directory's path must be short: a unix socket's path holds at most 107 bytes.
        """
        return cls(directory / f"data-{name}", directory / f"{name}.sock",
                   directory / f"{name}.log", extra_args, root, prefix)

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
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True,
                               check=True).stdout.strip()
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
        "path": str(path), "device": best[0] if best else None,
        "mount_point": best[1] if best else None, "filesystem": best[2] if best else None,
        "size_gb": round(stat.f_blocks * stat.f_frsize / 1e9), "rotational": None,
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
        "loadavg": loadavg(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: how busy the (shared) machine was."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def reproducing_command() -> str:
    """Return this run's command line, paths relative to the repository root if possible."""

    def rel(path: str) -> str:
        try:
            return str(Path(path).absolute().relative_to(REPO_ROOT))
        except ValueError:
            return path

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


# ---------------------------------------------------------------------- process probes
def read_rss_kib(pid: int | str = "self") -> tuple[int, int]:
    """Return ``(RssAnon, RssFile)`` in KiB for ``pid`` from ``/proc/<pid>/status``."""
    anon = file = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1])
            elif line.startswith("RssFile:"):
                file = int(line.split()[1])
    return anon, file


class RssSampler:
    """Background sampler of a process's ``RssAnon``/``RssFile`` that tracks peaks.

    Besides the peak over its whole lifetime it keeps a *window* peak that
    :meth:`reset_window` restarts, used for per-epoch peaks.
    """

    def __init__(self, pid: int | str = "self", interval_s: float = 0.02) -> None:
        """Sample ``/proc/<pid>/status`` every ``interval_s`` once started."""
        self._pid = pid
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_anon_kib = 0
        self.peak_file_kib = 0
        self.window_anon_kib = 0

    def start(self) -> RssSampler:
        """Take a first sample and start the background thread."""
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample and stop the background thread."""
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> int:
        """Take one sample now, update the peaks and return the current ``RssAnon`` (KiB)."""
        try:
            anon, file = read_rss_kib(self._pid)
        except (FileNotFoundError, ProcessLookupError):  # the sampled process is gone
            return 0
        with self._lock:
            self.peak_anon_kib = max(self.peak_anon_kib, anon)
            self.peak_file_kib = max(self.peak_file_kib, file)
            self.window_anon_kib = max(self.window_anon_kib, anon)
        return anon

    def reset_window(self) -> None:
        """Restart the window peak at the current value."""
        with self._lock:
            self.window_anon_kib = 0
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()


def kib_to_mb(kib: int) -> float:
    """Convert KiB (as ``/proc`` reports) to decimal MB."""
    return kib * 1024 / MB


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process so far, all its threads (``/proc/<pid>/stat``)."""
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
        raise PermissionError(f"a cold read needs to write /proc/sys/vm/drop_caches (root): "
                              f"{exc}") from exc


# ---------------------------------------------------------------------- timing
@dataclass
class EpochResult:
    """Outcome of one timed epoch."""

    seconds: float
    elements: int
    label_sum: int | None  # None when the epoch yields no labels (Dataset.save, bare tensors)


def timed_iteration(ds: tf.data.Dataset) -> EpochResult:
    """Iterate ``ds`` (a batched dataset) fully and time it.

    The clock covers iterator creation and the loop, and stops *before* the iterator is
    destroyed: tearing down a tf.data iterator (autotune, prefetch threads) can stall for
    seconds, which is not part of producing the data. A batch of ``(features, labels)`` is
    touched by reading its labels, which also yields an order-independent checksum; any
    other batch is counted by its first tensor's rows.
    """
    start = time.perf_counter()
    iterator = iter(ds)
    elements = 0
    label_sum: int | None = None
    for batch in iterator:
        if isinstance(batch, tuple) and len(batch) == 2:
            labels = batch[1]
            elements += int(labels.shape[0])
            label_sum = (label_sum or 0) + int(labels.numpy().sum())
        else:
            elements += int(_first_tensor(batch).shape[0])
    seconds = time.perf_counter() - start
    del iterator
    return EpochResult(seconds=seconds, elements=elements, label_sum=label_sum)


def _first_tensor(batch: Any) -> Any:
    while isinstance(batch, (tuple, list, dict)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return batch


# ---------------------------------------------------------------------- child processes
def print_result(record: dict[str, Any]) -> None:
    """A child's answer: one ``RESULT`` line of JSON on stdout (the rest is noise)."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(record, default=str) + "\n")
    sys.stdout.flush()


def run_child(cmd: Sequence[str], root: Path = REPO_ROOT, timeout_s: float | None = None,
              ) -> dict[str, Any]:
    """Run ``cmd`` with ``root``'s packages and return its ``RESULT`` record.

    Raises RuntimeError with the end of its stderr when it prints none (or times out).
    """
    try:
        proc = subprocess.run(list(cmd), cwd=root, env=child_env(root), capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"timed out after {timeout_s:g} s") from exc
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        killed = f" (killed by signal {-proc.returncode})" if proc.returncode < 0 else ""
        tail = " ".join(proc.stderr[-800:].split())
        raise RuntimeError(f"exit code {proc.returncode}{killed}, no result: {tail}")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_PREFIX):])
    return result


# ---------------------------------------------------------------------- tables
def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: a header row, its rule and one line per row."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float | None, base: float | None = 1.0, bold: bool = False,
          missing: str = "-") -> str:
    """``value / base`` as ``1.23x`` (bold: ``**1.23x**``), or ``missing`` without both."""
    if value is None or not base:
        return missing
    text = f"{value / base:.2f}x"
    return f"**{text}**" if bold else text
