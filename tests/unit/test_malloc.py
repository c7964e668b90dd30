"""glibc threshold tuning for the read path (client/tf/malloc.py)."""

from __future__ import annotations

import platform

import pytest

from client.tf import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_raising_the_thresholds_succeeds_on_glibc() -> None:
    assert malloc.tune()


def test_the_environment_can_turn_tuning_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCACHE_TUNE_MALLOC", "0")
    assert not malloc.enabled(True)
    monkeypatch.delenv("SHARDCACHE_TUNE_MALLOC")
    assert malloc.enabled(True)
    assert not malloc.enabled(False)
