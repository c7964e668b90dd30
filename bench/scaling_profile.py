"""Where one shardcache epoch spends its time: CPU per thread and py-spy's GIL holders.

Used by ``bench/scaling.py`` (``profile`` section). A child process (this file run as a
script) opens ``cc.dataset(name)``, reads one batch untimed, prints ``EPOCH_START``, reads
the whole epoch and prints ``EPOCH_END <seconds> <elements>``. Between the two lines the
parent has ``py-spy record --gil --nonblocking`` sampling the child and the daemon (100 Hz,
only the thread holding the GIL: the Python-level work, which one core at most can do per
process), and samples every thread's CPU time and run-queue wait from
``/proc/<pid>/task/*/schedstat`` every 50 ms
(Python threads, and TensorFlow's C++ threads that inherit the name, are ``python``; gRPC's
threads have their own names). GIL samples are aggregated by leaf function ("self").
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RATE_HZ = 100
_LINE = re.compile(r":\d+\)$")


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """Per thread of a process: {tid: (name, seconds on a CPU, seconds runnable but waiting).

    Both from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds): the wait is the time the
    thread was ready to run while the CPUs ran something else, i.e. what other processes on
    a shared machine took from it.
    """
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text(errors="replace")
            on_cpu, waiting = (task / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        threads[int(task.name)] = (name, int(on_cpu) / 1e9, int(waiting) / 1e9)
    return threads


class ThreadCpuSampler:
    """Samples thread_cpu() of some processes every 50 ms, keeping each thread's last value.

    Reader threads end with the epoch, taking their /proc entry with them; the last sample
    before that keeps their CPU time (to within 50 ms of it).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self.before = {role: thread_cpu(pid) for role, pid in pids.items()}
        self._last = {role: dict(snapshot) for role, snapshot in self.before.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-cpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def _sample(self) -> None:
        for role, pid in self._pids.items():
            self._last[role].update(thread_cpu(pid))

    def stop(self) -> dict[str, dict[str, tuple[float, float]]]:
        """Stop sampling; per process and thread name, (CPU s, run-queue wait s) since start."""
        self._stop.set()
        self._thread.join()
        self._sample()
        spent: dict[str, dict[str, tuple[float, float]]] = {}
        for role, last in self._last.items():
            cpu: dict[str, float] = collections.defaultdict(float)
            wait: dict[str, float] = collections.defaultdict(float)
            for tid, (name, on_cpu, waiting) in last.items():
                _, cpu0, wait0 = self.before[role].get(tid, (name, 0.0, 0.0))
                cpu[name] += on_cpu - cpu0
                wait[name] += waiting - wait0
            spent[role] = {name: (cpu[name], wait[name])
                           for name in sorted(cpu, key=lambda name: -cpu[name])}
        return spent


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("py-spy not found: install it with `.venv/bin/pip install py-spy`")
    return found


def hottest(raw_path: Path, top: int = 12) -> dict[str, Any]:
    """Self samples per function (file and name, line numbers dropped) from py-spy raw output."""
    per_function: collections.Counter[str] = collections.Counter()
    total = 0
    if raw_path.exists():
        for line in raw_path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            leaf = stack.rsplit(";", 1)[-1]
            per_function[_LINE.sub(")", leaf)] += int(count)
            total += int(count)
    return {"samples": total,
            "top": [(name, count / total) for name, count in per_function.most_common(top)]
            if total else []}


def profile_epoch(daemon: Any, name: str, n: int, batch_size: int,
                  client_options: list[tuple[str, Any]], work_dir: Path,
                  keep_dir: Path | None) -> dict[str, Any]:
    """Profile one epoch of cache ``name`` read by a fresh client; see the module docstring."""
    work_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(BENCH_DIR)]))
    child = subprocess.Popen(
        [sys.executable, __file__, daemon.address, name, str(batch_size),
         json.dumps(dict(client_options))],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    spies: list[subprocess.Popen[bytes]] = []
    try:
        line = child.stdout.readline()
        if not line.startswith("EPOCH_START"):
            raise RuntimeError(f"profile child failed before its epoch: {line!r}")
        pids = {"client": child.pid, "daemon": daemon.proc.pid}
        raws = {role: work_dir / f"{role}.raw" for role in pids}
        for role, pid in pids.items():
            spies.append(subprocess.Popen(
                [_py_spy(), "record", "--gil", "--nonblocking", "--rate", str(RATE_HZ), "--format",
                 "raw", "--output", str(raws[role]), "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        sampler = ThreadCpuSampler(pids)
        end = child.stdout.readline()
        threads = sampler.stop()
        if not end.startswith("EPOCH_END"):
            raise RuntimeError(f"profile child failed during its epoch: {end!r}")
        seconds = float(end.split()[1])
        elements = int(end.split()[2])
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for spy in spies:
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
        child.wait(120)
    if elements != n:
        raise RuntimeError(f"profiled epoch yielded {elements} elements, expected {n}")
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        for raw in raws.values():
            if raw.exists():
                shutil.copy(raw, keep_dir / raw.name)
    return {"seconds": seconds, "elements": elements,
            "cpu_seconds": {role: sum(c for c, _ in t.values()) for role, t in threads.items()},
            "runqueue_wait_seconds": {role: sum(w for _, w in t.values())
                                      for role, t in threads.items()},
            "thread_cpu_seconds": threads,
            "frames": {role: hottest(raw) for role, raw in raws.items()},
            "rate_hz": RATE_HZ}


def _child(target: str, name: str, batch_size: int, options: dict[str, Any]) -> None:
    from strategies import timed_iteration

    from client import CacheClient

    with CacheClient(target) as cc:
        ds = cc.dataset(name, **options).batch(batch_size)
        for _ in ds.take(1):  # start TF's machinery and the first streams untimed
            pass
        print("EPOCH_START", flush=True)
        start = time.perf_counter()
        result = timed_iteration(ds)
        print(f"EPOCH_END {time.perf_counter() - start:.6f} {result.elements}", flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
