"""`cacheserver demo` as a user runs it: a real subprocess, a real daemon, real training."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from daemon import env_without_tf_noise

pytestmark = pytest.mark.slow

SMALL = ["--elements", "200", "--epochs", "2", "--image-size", "32"]
#: An epoch 1 long enough to be interrupted in (it once finished first, under load).
LONGER = ["--elements", "2000", "--epochs", "2", "--image-size", "32"]
TIMEOUT_S = 240
DAEMON_LINE = re.compile(r"^daemon: pid (\d+) serving unix://(\S+)", re.MULTILINE)


@dataclass
class DemoRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def daemon_pid(self) -> int:
        match = DAEMON_LINE.search(self.stdout)
        assert match, self.stdout
        return int(match.group(1))

    @property
    def socket(self) -> Path:
        match = DAEMON_LINE.search(self.stdout)
        assert match, self.stdout
        return Path(match.group(2))

    def epoch_line(self, label: str, epoch: int, of: int) -> str:
        pattern = (
            rf"^\s*{re.escape(label)}\s+epoch {epoch}/{of}\s+[\d.]+ s\s+[\d,]+ elements/s"
            r"\s+peak RssAnon\s+[\d.]+ [KMG]iB.*$"
        )
        match = re.search(pattern, self.stdout, re.MULTILINE)
        assert match, f"no {label} epoch {epoch}/{of} line in:\n{self.stdout}"
        return match.group(0)


def run_demo(data_dir: Path | None, *args: str, xdg_cache_home: Path | None = None) -> DemoRun:
    """Run `cacheserver demo ARGS` (with --data-dir unless None) to completion."""
    env = env_without_tf_noise()
    if xdg_cache_home is not None:
        env["XDG_CACHE_HOME"] = str(xdg_cache_home)
    where = ["--data-dir", str(data_dir)] if data_dir is not None else []
    proc = subprocess.run(
        [sys.executable, "-m", "cacheserver", "demo", *args, *where],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    return DemoRun(proc.returncode, proc.stdout, proc.stderr)


def processes_using(data_dir: Path) -> list[psutil.Process]:
    """Live processes whose command line names data_dir: the daemon, training children."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if str(data_dir) in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def assert_daemon_gone(run: DemoRun, data_dir: Path) -> None:
    assert (
        not psutil.pid_exists(run.daemon_pid)
        or psutil.Process(run.daemon_pid).status() == psutil.STATUS_ZOMBIE
    )
    assert processes_using(data_dir) == []
    assert not run.socket.exists()
    assert not run.socket.parent.exists(), "the socket's temporary directory was left behind"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DemoRun, DemoRun]:
    """The small demo run twice in one data directory, as a user reruns it: first with
    --data-dir, then with the default directory under $XDG_CACHE_HOME, which is the same."""
    cache_home = tmp_path_factory.mktemp("xdg")
    data_dir = cache_home / "shardcache" / "demo"
    first = run_demo(data_dir, *SMALL)
    second = run_demo(None, *SMALL, xdg_cache_home=cache_home)
    return data_dir, first, second


def test_the_demo_trains_through_cc_cache_and_ds_cache_and_prints_every_epoch(
    two_runs: tuple[Path, DemoRun, DemoRun],
) -> None:
    _, run, _ = two_runs
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert "source pipeline, written through to the daemon" in run.epoch_line("cc.cache", 1, 2)
    assert "streamed from the daemon" in run.epoch_line("cc.cache", 2, 2)
    assert "source pipeline, filled into memory" in run.epoch_line("ds.cache", 1, 2)
    assert "from memory" in run.epoch_line("ds.cache", 2, 2)
    assert "Traceback" not in run.stdout + run.stderr


def test_the_demo_prints_a_comparison_table_and_what_the_daemon_stored(
    two_runs: tuple[Path, DemoRun, DemoRun],
) -> None:
    _, run, _ = two_runs
    assert run.returncode == 0, run.stderr
    assert re.search(
        r"^\s+epoch 1 \(source\)\s+epoch 2 \(cache\)\s+RssAnon before"
        r"\s+peak RssAnon\s+daemon peak$",
        run.stdout,
        re.MULTILINE,
    )
    for label in ("cc.cache", "ds.cache"):
        assert re.search(
            rf"^\s+{re.escape(label)}\s+[\d.]+ s\s+[\d,]+/s\s+[\d.]+ s", run.stdout, re.MULTILINE
        ), run.stdout
    assert re.search(r"^\s+name\s+demo-200x32px$", run.stdout, re.MULTILINE)
    assert re.search(r"^\s+state\s+READY$", run.stdout, re.MULTILINE)
    assert re.search(r"^\s+elements\s+200$", run.stdout, re.MULTILINE)
    assert re.search(r"^\s+compression\s+[\d.]+x", run.stdout, re.MULTILINE)


def test_the_demo_stops_its_daemon_gracefully_before_exiting(
    two_runs: tuple[Path, DemoRun, DemoRun],
) -> None:
    data_dir, first, second = two_runs
    for run in (first, second):
        assert run.returncode == 0, run.stderr
        assert "daemon stopped (exit status 0)" in run.stdout
        assert_daemon_gone(run, data_dir)
    log = (data_dir / "daemon.log").read_text()
    assert "received SIGTERM" in log and log.rstrip().endswith("stopped"), log


def test_a_second_run_reuses_the_images_and_writes_the_cache_again(
    two_runs: tuple[Path, DemoRun, DemoRun],
) -> None:
    data_dir, first, second = two_runs
    assert second.returncode == 0, second.stderr
    assert f"data directory: {data_dir}\n" in second.stdout
    assert "generating 200 PNG images" in first.stdout
    assert "reusing 200 PNG images" in second.stdout
    assert "deleted the cache 'demo-200x32px' of an earlier run" in second.stdout
    assert "written through to the daemon" in second.epoch_line("cc.cache", 1, 2)
    assert "streamed from the daemon" in second.epoch_line("cc.cache", 2, 2)


def test_ctrl_c_during_training_stops_the_daemon_too(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = env_without_tf_noise()
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cacheserver", "demo", *LONGER, "--data-dir", str(data_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # as a terminal's foreground process: SIGINT not ignored, whatever this process
        # inherited (a child started with SIGINT ignored keeps it so, as nohup's do)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("training through cc.cache"):
                break
        else:
            pytest.fail(f"the demo ended before training:\n{''.join(lines)}")
        # Interrupt while epoch 1 writes through: the daemon logs the write's start.
        deadline = time.monotonic() + 120
        while "writing cache 'demo-2000x32px'" not in (data_dir / "daemon.log").read_text():
            assert time.monotonic() < deadline, "the cache write never started"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rest, stderr = proc.communicate(timeout=60)  # a hang at exit fails here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run = DemoRun(proc.returncode, "".join(lines) + rest, stderr)
    assert run.returncode != 0, f"not interrupted:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "Aborted" in run.stderr
    assert "daemon stopped" not in run.stdout
    assert_daemon_gone(run, data_dir)
    log = (data_dir / "daemon.log").read_text()
    assert "received SIGTERM" in log and log.rstrip().endswith("stopped"), log


def test_the_demo_without_tensorflow_says_how_to_install_it(tmp_path: Path) -> None:
    # sys.modules[name] = None is how Python marks a module as not importable.
    code = (
        "import sys; sys.modules['tensorflow'] = None; "
        "from cacheserver.cli.main import main; main(prog_name='cacheserver')"
    )
    data_dir = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-c", code, "demo", *SMALL, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert proc.returncode == 1
    assert "pip install 'shardcache[tf-cpu]'" in proc.stderr
    assert "make demo" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "daemon:" not in proc.stdout
    assert not data_dir.exists(), "the demo started work before checking for TensorFlow"
