"""`cacheserver ls / info / pin / unpin / ttl / rm --target` against a real daemon."""

from __future__ import annotations

import subprocess
import sys

import grpc
from daemon import Daemon
from wire import read_all, records, write_cache


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cacheserver", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_cli_lists_pins_sets_ttl_and_removes_caches(fresh_daemon: Daemon) -> None:
    target = ("--target", fresh_daemon.unix_target)
    with grpc.insecure_channel(fresh_daemon.unix_target) as ch:
        write_cache(ch, "alpha", records(4, 1000))
        write_cache(ch, "beta", records(4, 1000))
        read_all(ch, "alpha")
    out = cli("ls", *target)
    assert out.returncode == 0, out.stderr
    header, alpha, beta = out.stdout.splitlines()
    assert "LAST READ" in header and "HITS" in header and "RETENTION" in header
    assert alpha.startswith("alpha") and " READY " in alpha and "evictable" in alpha
    assert " 1 evictable" in alpha and "never" in beta and " 0 evictable" in beta
    assert cli("pin", "beta", *target).stdout == "pinned beta\n"
    assert cli("ttl", "beta", "3600", *target).stdout == "beta: ttl 3600s\n"
    info = cli("info", "beta", *target).stdout
    assert "retention    pinned, ttl 3600s" in info and "last read    never" in info
    assert cli("unpin", "beta", *target).returncode == 0
    assert cli("ttl", "beta", "0", *target).stdout == "beta: no ttl\n"
    assert "retention    evictable\n" in cli("info", "beta", *target).stdout
    missing = cli("pin", "gamma", *target)
    assert missing.returncode == 1 and "cache 'gamma' not found" in missing.stderr
    assert cli("rm", "alpha", "beta", *target).returncode == 0
    assert cli("ls", *target).stdout.count("\n") == 1
