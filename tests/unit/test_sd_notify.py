"""sd_notify: the datagrams systemd's Type=notify expects, over a real unix socket."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cacheserver.rpc.server import sd_notify


@pytest.fixture
def notify_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sdn-", dir="/tmp"))  # short: sun_path is 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


def test_without_notify_socket_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify("READY=1") is False


def test_it_sends_the_state_as_one_datagram_to_a_socket_path(
    notify_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = notify_dir / "notify"
    with _receiver(str(path)) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sd_notify("READY=1") is True
        assert sd_notify("STOPPING=1") is True
        assert sock.recv(4096) == b"READY=1"
        assert sock.recv(4096) == b"STOPPING=1"


def test_an_at_sign_names_a_socket_in_the_abstract_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"shardcache-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with _receiver(b"\0" + name.encode()) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", f"@{name}")
        assert sd_notify("READY=1") is True
        assert sock.recv(4096) == b"READY=1"


def test_a_missing_socket_is_logged_not_raised(
    notify_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_dir / "nobody-listens"))
    assert sd_notify("READY=1") is False
    assert "sd_notify" in caplog.text
