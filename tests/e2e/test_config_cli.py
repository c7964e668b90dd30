"""The configuration precedence as a real `cacheserver serve` process sees it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from daemon import Daemon


def test_a_real_daemon_takes_flags_over_environment_over_its_toml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text('socket_mode = "0600"\nlog_format = "json"\n')
    monkeypatch.setenv("CACHESERVER_SOCKET_MODE", "0640")
    monkeypatch.setenv("CACHESERVER_CONFIG", str(toml))
    d = Daemon().start()
    try:
        assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o640, "environment beats the file"
        assert d.log().lstrip().startswith("{"), "the file's log_format applies"
    finally:
        d.close()
    d = Daemon(extra_args=("--socket-mode", "0620")).start()
    try:
        assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o620, "the flag beats both"
    finally:
        d.close()


def test_an_unknown_key_in_the_config_file_stops_serve_with_the_closest_key(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text('data_dir = "/tmp/never-created"\nmetrics_lisen = "127.0.0.1:9464"\n')
    result = subprocess.run(
        [sys.executable, "-m", "cacheserver", "serve", "--config", str(toml)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unknown setting 'metrics_lisen'" in result.stderr
    assert "did you mean 'metrics_listen'?" in result.stderr
    assert not Path("/tmp/never-created").exists()
