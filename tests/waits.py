"""Waiting on a condition with a deadline, for tests (never a bare sleep as synchronisation)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], object],
    deadline_s: float = 30.0,
    what: str | Callable[[], str] = "condition",
) -> None:
    """Poll predicate every 50 ms; TimeoutError past deadline_s, saying what (or what()
    returns then: the state that was waited on) was not met."""
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise TimeoutError(f"{said} not met within {deadline_s:g} s")
        time.sleep(0.05)


def gone(cc: Any, name: str) -> bool:
    """True once the daemon no longer knows cache name (a CacheClient's view)."""
    from client import CacheNotFoundError

    try:
        cc.info(name)
    except CacheNotFoundError:
        return True
    return False


class LostDaemon(logging.Handler):
    """Sets lost when the client logs that it lost a daemon and is reconnecting (add it to
    the "client" logger)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lost = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "reconnecting" in record.getMessage():
            self.lost.set()
