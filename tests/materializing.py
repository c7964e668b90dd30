"""Daemons that run the test pipelines (tests/pipelines/mat_pipelines.py) as materialization
entry points, and what the materialization tests compare their caches with."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import psutil
import tensorflow as tf
from daemon import Daemon

PIPELINES = Path(__file__).resolve().parent / "pipelines"
sys.path.insert(0, str(PIPELINES))

import mat_pipelines  # noqa: E402

#: show an import error), and shipped graphs (tests/integration/test_materialize_security.py
#: covers the refusals).
ALLOW = (
    "--pythonpath",
    str(PIPELINES),
    "--materialize-allow",
    "mat_pipelines,no_such_module",
    "--allow-shipped-pipelines",
)


def materializing_daemon(
    gate: Path, data_dir: Path | None = None, extra_args: tuple[str, ...] = ()
) -> Daemon:
    """A daemon whose workers find tests/pipelines and whose gated() waits for gate."""
    os.environ[mat_pipelines.GATE_ENV] = str(gate)  # the daemon inherits it
    try:
        return Daemon(data_dir=data_dir, extra_args=(*ALLOW, *extra_args)).start()
    finally:
        del os.environ[mat_pipelines.GATE_ENV]


def elements(ds: tf.data.Dataset) -> list[dict]:
    return list(ds.as_numpy_iterator())


def assert_same_elements(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.keys() == b.keys(), i
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"element {i}, {key!r}")


def expected_records(num_shards: int) -> list[dict]:
    out: list[dict] = []
    for shard in range(num_shards):
        out += elements(mat_pipelines.records(shard, num_shards))
    return out


def workers_of(pid: int) -> list[psutil.Process]:
    """The daemon's materialization workers (not multiprocessing's resource tracker)."""
    return [p for p in psutil.Process(pid).children() if "spawn_main" in " ".join(p.cmdline())]


def assert_records(ds: tf.data.Dataset, num_shards: int) -> None:
    """ds holds exactly records() of num_shards shards, in shard order."""
    assert_same_elements(elements(ds), expected_records(num_shards))
