"""Materialization under failure: a daemon killed or stopped mid-operation resumes to the same
cache, a full disk fails the operation and frees its space, --max-bytes evicts to fit."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from exposition import scrape
from waits import wait_until

tf = pytest.importorskip("tensorflow")

from daemon import Daemon, free_port  # noqa: E402
from materializing import (  # noqa: E402
    assert_records,
    assert_same_elements,
    elements,
    expected_records,
    materializing_daemon,
    workers_of,
)

from client import CacheClient, DiskFullError, MaterializeOperation  # noqa: E402

# --------------------------------------------------------------------------- crash recovery


@pytest.fixture
def gated_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """A materializing daemon of the test's own (it is killed or stopped), and its gate."""
    gate = tmp_path / "gate"
    daemon = materializing_daemon(gate)
    yield daemon, gate
    daemon.close()


def start_gated(cc: CacheClient, name: str, resume: bool = False) -> MaterializeOperation:
    """gated() over 4 shards in 2 workers: shards 2 and 3 hold until the gate file exists."""
    return cc.materialize(
        "mat_pipelines:gated", name=name, num_shards=4, workers=2, wait=False, resume=resume
    )


def test_a_daemon_killed_mid_materialization_resumes_and_builds_the_same_cache(
    gated_daemon: tuple[Daemon, Path],
) -> None:
    daemon, gate = gated_daemon
    with CacheClient(daemon.unix_target) as cc:
        op = start_gated(cc, "crashed")
        cache_dir = daemon.data_dir / "caches" / "crashed"
        wait_until(
            lambda: (
                op.progress().shards_done == 2
                and (cache_dir / "shard-00002").is_dir()
                and (cache_dir / "shard-00003").is_dir()
            ),
            120,
            "two shards committed, two being written",
        )
        workers = workers_of(daemon.proc.pid)
    daemon.kill()  # SIGKILL: nothing gets to clean up
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive, "workers must die with the daemon"
    assert (cache_dir / "shard-00001.json").exists()
    assert not (cache_dir / "shard-00002.json").exists()
    assert (cache_dir / "shard-00002" / "data.mdb").exists()

    gate.touch()
    daemon.start()  # resumes on its own
    with CacheClient(daemon.unix_target) as cc:
        assert cc.info("crashed").state in ("WRITING", "READY")
        progress = start_gated(cc, "crashed", resume=True).wait(timeout=300)
        assert (progress.state, progress.shards_resumed) == ("SUCCEEDED", 2)
        assert "resuming materialization of cache 'crashed': 2 of 4" in daemon.log()
        resumed = elements(cc.dataset("crashed"))
        cc.materialize("mat_pipelines:gated", name="uninterrupted", num_shards=4, workers=2)
        assert_same_elements(resumed, elements(cc.dataset("uninterrupted")))
        assert_same_elements(resumed, expected_records(4))


def test_a_sigterm_stops_the_workers_keeps_committed_shards_and_the_restart_resumes(
    gated_daemon: tuple[Daemon, Path],
) -> None:
    daemon, gate = gated_daemon
    with CacheClient(daemon.unix_target) as cc:
        op = start_gated(cc, "stopped")
        wait_until(lambda: op.progress().shards_done == 2, 120, "two shards committed")
        workers = workers_of(daemon.proc.pid)
    assert daemon.terminate() == 0
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive
    assert "the daemon shut down during materialize/stopped" in daemon.log()
    gate.touch()
    daemon.start()
    with CacheClient(daemon.unix_target) as cc:
        progress = start_gated(cc, "stopped", resume=True).wait(timeout=300)
        assert (progress.state, progress.shards_resumed) == ("SUCCEEDED", 2)
        assert_records(cc.dataset("stopped"), 4)


# --------------------------------------------------------------------------- full disk


def test_a_full_disk_fails_the_operation_releases_its_space_and_keeps_other_caches(
    small_disk: Path, tmp_path: Path
) -> None:
    daemon = materializing_daemon(tmp_path / "gate", data_dir=small_disk / "data")
    try:
        with CacheClient(daemon.unix_target) as cc:
            cc.materialize("mat_pipelines:records", name="small", num_shards=1, workers=1)
            free_before = shutil.disk_usage(small_disk).free
            with pytest.raises(DiskFullError, match=r"shard \d: disk full under .*free space"):
                cc.materialize("mat_pipelines:big", name="big", num_shards=4, workers=2)
            assert [c.name for c in cc.list()] == ["small"]
            assert shutil.disk_usage(small_disk).free >= free_before - (1 << 20), (
                "the failed shards' space must be released"
            )
            assert_records(cc.dataset("small"), 1)
        assert "DISK_FULL" in daemon.log() or "disk full" in daemon.log()
    finally:
        daemon.close()


def test_materialization_counts_against_max_bytes_evicts_to_fit_and_shows_in_metrics(
    tmp_path: Path,
) -> None:
    from client import CapacityExceededError

    url = f"http://127.0.0.1:{free_port()}/metrics"
    daemon = materializing_daemon(
        tmp_path / "gate",
        extra_args=("--max-bytes", "20MiB", "--metrics-listen", url.split("/")[2]),
    )

    def metric(name: str, **labels: str) -> float:
        return scrape(url)[(name, tuple(sorted(labels.items())))]

    try:
        with CacheClient(daemon.unix_target) as cc:
            cc.materialize("mat_pipelines:records", name="small", num_shards=1, workers=1)
            cc.materialize("mat_pipelines:big", name="big", num_shards=2, workers=2)  # 16 MiB
            # 16 MiB more does not fit beside "big": the least recently used go, "small" first
            cc.materialize("mat_pipelines:big", name="big2", num_shards=2, workers=2)
            assert [c.name for c in cc.list()] == ["big2"]
            cc.pin("big2")
            with pytest.raises(CapacityExceededError, match=r"--max-bytes is 20,971,520 bytes"):
                cc.materialize("mat_pipelines:big", name="big3", num_shards=2, workers=2)
            assert [c.name for c in cc.list()] == ["big2"]
            assert cc.info("big2").num_elements == 128
            assert metric("shardcache_materializations_total", state="SUCCEEDED") == 3
            assert metric("shardcache_materializations_total", state="FAILED") == 1
            assert metric("shardcache_evictions_total", reason="capacity") == 2
            assert metric("shardcache_materialized_shards_total") >= 5
            assert metric("shardcache_materialized_elements_total") >= 20 + 3 * 64
            assert metric("shardcache_materialized_bytes_total") >= 3 * (8 << 20)
            assert metric("shardcache_disk_bytes") <= 20 << 20
    finally:
        daemon.close()
