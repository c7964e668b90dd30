"""What every bench entry point shares: daemons, options, machine facts, probes, timing, tables."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
#: The checkout whose packages a bench process imports: this one, or in a child process of
#: an A/B, the other checkout's (``child_env`` names it).
ROOT_ENV = "SHARDCACHE_BENCH_ROOT"
sys.path.insert(1, os.environ.get(ROOT_ENV, str(REPO_ROOT)))  # after the script's own folder
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process's TensorFlow and its children's

from cacheserver.launch import DaemonProcess  # noqa: E402

if TYPE_CHECKING:
    import tensorflow as tf

    from tests.fleet import NetnsLink

MB, GB, GIB = 1_000_000, 1_000_000_000, 1 << 30
RESULT_PREFIX = "RESULT "


# ---------------------------------------------------------------------- daemons
T = TypeVar("T")

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

    def __init__(self, directory: Path, name: str, extra_args: Sequence[str] = (),
                 root: Path = REPO_ROOT, prefix: Sequence[str] = (),
                 data_root: Path | None = None, tcp: bool = False, host: str = "127.0.0.1"
                 ) -> None:
        data_dir = (data_root or directory) / f"data-{name}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.tcp_target = f"{host}:{free_port()}" if tcp else None
        super().__init__(data_dir, [f"unix://{directory / name}.sock",
                                    *filter(None, [self.tcp_target])],
                         (data_root or directory) / f"{name}.log", extra_args=extra_args,
                         env=child_env(root, safe_path=True))
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


# ---------------------------------------------------------------------- machine facts
def linked_daemon(directory: Path, name: str, link: NetnsLink | None
                  ) -> tuple[BenchDaemon, str]:
    """A daemon (not started) with a TCP address and ``--metrics-listen``, inside link's
    network namespace (reached across its veth pair), or on loopback without one; and its
    metrics HOST:PORT."""
    host = link.host if link is not None else "127.0.0.1"
    metrics = f"{host}:{free_port()}"
    return BenchDaemon(directory, name, tcp=True, host=host,
                       prefix=link.prefix if link is not None else (),
                       extra_args=("--metrics-listen", metrics)), metrics


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
    return (f"`{reproducing_command()}`: {len(os.sched_getaffinity(0))} core(s), load average "
            f"{load} (1/5/15 min), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} UTC\n")


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
    """Iterate a batched ``ds`` once, timed from creating the iterator to its last batch.

    The clock stops *before* the iterator is destroyed: tearing one down (autotune, prefetch
    threads) can stall for seconds. ``(features, labels)`` batches are checked by the sum of
    their labels; other batches are counted by their first tensor's rows.
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


#: What :func:`timed` gives: seconds, bytes moved, CPU seconds of this process and of the server.
Row = tuple[float, int, float, float]
ROW_KEYS = ("seconds", "bytes", "cpu", "server_cpu")


def timed(fn: Callable[[], int], server_pid: int = 0) -> Row:
    """Run fn (returning bytes moved): its seconds, bytes and CPU seconds (self, server)."""
    before, server_before = cpu_seconds(), cpu_seconds(server_pid) if server_pid else 0.0
    start = time.perf_counter()
    moved = fn()
    seconds = time.perf_counter() - start
    server = cpu_seconds(server_pid) - server_before if server_pid else 0.0
    return seconds, moved, cpu_seconds() - before, server


def per_gb(cpu: float, moved: int) -> str:
    """CPU seconds per GB moved, ``-`` for none measured."""
    return f"{cpu / (moved / GB):.2f}" if cpu else "-"


# ---------------------------------------------------------------------- child processes
def print_result(record: dict[str, Any]) -> None:
    """A child's answer: one ``RESULT`` line of JSON on stdout (the rest is noise)."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(record, default=str) + "\n")
    sys.stdout.flush()


def read_result(line: str) -> dict[str, Any] | None:
    """The record of a ``RESULT`` line, None for any other line."""
    return json.loads(line[len(RESULT_PREFIX):]) if line.startswith(RESULT_PREFIX) else None


def server_process(script: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """``script --serve ...`` in a process of its own (a bench's server), and the port it
    prints as its first line (0: it printed none)."""
    proc = subprocess.Popen([sys.executable, script, "--serve", *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline() or 0)


def run_child(cmd: Sequence[str], root: Path = REPO_ROOT, timeout_s: float | None = None,
              ) -> dict[str, Any]:
    """Run ``cmd`` with ``root``'s packages; its last ``RESULT`` record, or RuntimeError."""
    try:
        proc = subprocess.run(list(cmd), cwd=root, env=child_env(root), capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"timed out after {timeout_s:g} s") from exc
    results = [r for r in map(read_result, proc.stdout.splitlines()) if r is not None]
    if not results:
        killed = f" (killed by signal {-proc.returncode})" if proc.returncode < 0 else ""
        tail = " ".join(proc.stderr[-800:].split())
        raise RuntimeError(f"exit code {proc.returncode}{killed}, no result: {tail}")
    return results[-1]


# ---------------------------------------------------------------------- command lines, output
def arguments(doc: str | None, baseline: bool = False, out: bool = False,
           repeat: int | None = None) -> argparse.ArgumentParser:
    """An entry point's parser, its docstring the description, with the options the entry
    points share: ``--baseline-root``, ``--out`` and ``--repeat`` (its default)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if baseline:
        parser.add_argument("--baseline-root", type=Path, default=None, metavar="DIR",
                            help="another checkout, measured beside this one in the same run")
    if out:
        parser.add_argument("--out", type=Path, help="write the raw numbers here (JSON)")
    if repeat is not None:
        parser.add_argument("--repeat", type=int, default=repeat,
                            help=f"runs of each measurement (default {repeat})")
    return parser


def write_json(path: Path | None, payload: object) -> None:
    """Write ``payload`` to ``path`` (if any) as JSON, and say so on stderr."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"raw results written to {path}", file=sys.stderr)


# ---------------------------------------------------------------------- tables
def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
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


#: An arm reads one epoch: (elements/s, CPU seconds of the reading process).
Arm = Callable[[], tuple[float, float]]


def local_arm(ds: Any, n: int) -> Arm:
    """An arm that reads ``ds`` (batches) in this process, checking it yields n elements."""

    def read() -> tuple[float, float]:
        before = cpu_seconds()
        result = timed_iteration(ds)
        if result.elements != n:
            raise RuntimeError(f"an epoch yielded {result.elements} elements, not {n}")
        return n / result.seconds, cpu_seconds() - before

    return read


def interleaved(arms: dict[str, Callable[[], T]], repeat: int) -> dict[str, list[T]]:
    """Each arm once to warm up, then repeat passes of every arm in turn (A, B, ..., A, B,
    ...), so that every one meets the same noise: each arm's results, in order."""
    for arm in arms.values():
        arm()
    results: dict[str, list[T]] = {name: [] for name in arms}
    for i in range(repeat):
        for name, arm in arms.items():
            results[name].append(arm())
        print(f"pass {i + 1}/{repeat} done", file=sys.stderr)
    return results
