"""client/write/spare_cpu.py: idle CPU from /proc/stat and cgroup v2 files, the gate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from client import settings
from client.errors import InvalidArgumentError
from client.write import spare_cpu
from client.write.spare_cpu import CompressGate, Sample, SpareCpu, idle_ticks, spare_between

STAT = """cpu  900 0 300 5000 40 0 10 0 0 0
cpu0 500 0 100 2000 20 0 5 0 0 0
cpu1 400 0 200 3000 20 0 5 0 0 0
cpu12 1 2 3 4000 5 6 7 8 9 10
intr 12345 0 0
ctxt 999
"""


def test_idle_ticks_add_idle_and_iowait_of_the_allowed_cpus_only() -> None:
    assert idle_ticks(STAT, {0}) == 2020
    assert idle_ticks(STAT, {0, 1}) == 5040
    assert idle_ticks(STAT, {12}) == 4005  # cpu12 is not cpu1
    assert idle_ticks(STAT, {7}) == 0


def test_idle_ticks_read_this_machine() -> None:
    text = Path("/proc/stat").read_text()
    assert idle_ticks(text, set(os.sched_getaffinity(0))) > 0


def test_spare_is_idle_time_over_wall_time_capped_by_the_quota() -> None:
    a, b = Sample(10.0, 100.0, 50.0), Sample(10.5, 100.75, 50.25)
    assert spare_between(a, b, None) == pytest.approx(1.5)
    # a 2-core quota of which the cgroup used 0.5 cores: 1.5 left, the CPUs' idle says 1.5
    assert spare_between(a, b, 2.0) == pytest.approx(1.5)
    # a 1-core quota used at 0.5: only 0.5 left, however idle the host's CPUs are
    assert spare_between(a, b, 1.0) == pytest.approx(0.5)
    assert spare_between(a, Sample(10.5, 100.0, 50.5), 1.0) == 0.0


def _roots(tmp_path: Path, cpu_max: str | None) -> tuple[Path, Path]:
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "stat").write_text(STAT)
    (proc / "self" / "cgroup").write_text("0::/kubepods/pod1/trainer\n")
    pod = cgroup / "kubepods" / "pod1" / "trainer"
    pod.mkdir(parents=True)
    if cpu_max is not None:
        (pod / "cpu.max").write_text(cpu_max)
    (pod / "cpu.stat").write_text("usage_usec 5000000\nuser_usec 4000000\n")
    return proc, cgroup


def test_a_cgroup_cpu_limit_is_found_from_proc_self_cgroup(tmp_path: Path) -> None:
    proc, cgroup = _roots(tmp_path, "150000 100000\n")
    assert spare_cpu._cgroup_quota(proc, cgroup) == (cgroup / "kubepods" / "pod1" / "trainer", 1.5)
    assert spare_cpu._cgroup_usage(cgroup / "kubepods" / "pod1" / "trainer") == 5.0


@pytest.mark.parametrize("cpu_max", ["max 100000\n", None, "garbage\n"])
def test_no_cpu_limit_means_no_quota(tmp_path: Path, cpu_max: str | None) -> None:
    assert spare_cpu._cgroup_quota(*_roots(tmp_path, cpu_max)) == (None, None)


class Windows:
    """A SpareCpu stand-in that hands out given windows: (idle cores, seconds) or None."""

    def __init__(self, *windows: tuple[float, float] | None) -> None:
        self._windows = list(windows)

    def window(self) -> tuple[float, float] | None:
        return self._windows.pop(0)


def test_the_gate_compresses_until_the_cpus_stop_idling_beside_it() -> None:
    gate = CompressGate(Windows(None, (0.8, 0.2), (0.05, 0.2), None))  # type: ignore[arg-type]
    assert gate.compress()  # nothing measured yet
    gate.packed(0.06)  # compressing took 0.3 cores over the 0.2 s window
    assert gate.compress()  # 0.8 cores idle beside it: free
    gate.packed(0.06)
    assert not gate.compress()  # none idle: it competed with the pipeline
    assert not gate.compress()  # no new window: the decision stands


def test_storing_raw_the_gate_compresses_again_once_idle_covers_what_compressing_took() -> None:
    windows = Windows((0.0, 0.2), (0.35, 0.2), (0.45, 0.2))
    gate = CompressGate(windows)  # type: ignore[arg-type]
    gate.packed(0.06)  # 0.3 cores compressing
    assert not gate.compress()  # busy: raw
    gate.packed(0.01)  # raw packing is cheap, and says nothing of compression's cost
    assert not gate.compress()  # 0.35 idle < 0.3 + KEEP_CORES
    assert gate.compress()  # 0.45 idle: enough


def test_spare_cpu_measures_windows_of_at_least_window_s(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(spare_cpu.time, "monotonic", lambda: clock[0])
    cpu = SpareCpu()
    assert cpu.window() is None
    clock[0] += spare_cpu.WINDOW_S
    idle, wall = cpu.window()  # type: ignore[misc]
    assert wall == pytest.approx(spare_cpu.WINDOW_S) and idle >= 0.0
    assert cpu.window() is None  # a new window began


@pytest.mark.parametrize(
    "value,mode", [("", "always"), ("spare-cpu", "spare-cpu"), (" Always ", "always")]
)
def test_compress_mode_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, mode: str
) -> None:
    monkeypatch.setenv(settings.COMPRESS.name, value)
    assert spare_cpu.compress_mode() == mode


def test_an_unknown_compress_mode_says_which_are_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.COMPRESS.name, "never")
    with pytest.raises(InvalidArgumentError, match="'never' is not one of always, spare-cpu"):
        spare_cpu.compress_mode()
