"""A cache written by an earlier shardcache (format 1, tests/fixtures/format1) is served by
today's daemon and read exactly by today's client, on every read path, and reused by cc.cache()."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from daemon import Daemon  # noqa: E402

from client import CacheClient  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "format1"
NAME = "format1-mixed"
N = 300


def element(i: tf.Tensor) -> dict[str, tf.Tensor]:
    """The fixture's pipeline, as tests/fixtures/format1/make_fixture.py wrote it."""
    return {
        "i": i,
        "x": tf.cast(tf.range(4) + tf.cast(i, tf.int32), tf.float32) / 4.0,
        "s": tf.strings.join(["element-", tf.strings.as_string(i)]),
        "v": tf.range(i % 5, dtype=tf.int32),
    }


def expected(i: int) -> dict[str, object]:
    return {
        "i": i,
        "x": (np.arange(4, dtype=np.float32) + i) / 4,
        "s": f"element-{i}".encode(),
        "v": np.arange(i % 5, dtype=np.int32),
    }


def check_exact(ds: tf.data.Dataset) -> None:
    got = list(ds.as_numpy_iterator())
    assert len(got) == N
    for i, element in enumerate(got):
        want = expected(i)
        assert element["i"] == want["i"] and element["s"] == want["s"], i
        for key in ("x", "v"):
            assert element[key].dtype == want[key].dtype, (i, key)  # type: ignore[union-attr]
            np.testing.assert_array_equal(element[key], want[key], err_msg=f"{i} {key}")


@pytest.fixture(scope="module")
def old_cache_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    data = tmp_path_factory.mktemp("format1") / "data"
    shutil.copytree(FIXTURE / "caches", data / "caches")  # the fixture itself stays untouched
    daemon = Daemon(data_dir=data)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()


def test_the_fixture_is_a_format_1_cache() -> None:
    manifest = (FIXTURE / "caches" / NAME / "manifest.json").read_text()
    assert '\\"format\\":1,' in manifest, "the fixture must stay as the earlier version wrote it"


def test_todays_daemon_lists_the_earlier_cache_as_ready(old_cache_daemon: Daemon) -> None:
    with CacheClient(old_cache_daemon.unix_target) as cc:
        info = cc.info(NAME)
    assert (info.state, info.num_elements, info.num_shards) == ("READY", N, 1)


@pytest.mark.parametrize(
    ("where", "direct"),
    [("unix", True), ("unix", False), ("tcp", False)],
    ids=["direct", "grpc", "data-plane"],
)
def test_todays_client_reads_every_element_exactly(
    old_cache_daemon: Daemon, where: str, direct: bool
) -> None:
    target = old_cache_daemon.unix_target if where == "unix" else old_cache_daemon.tcp_target
    with CacheClient(target) as cc:
        check_exact(cc.dataset(NAME, direct=direct))


def test_a_shuffled_read_of_the_earlier_cache_is_a_permutation(old_cache_daemon: Daemon) -> None:
    with CacheClient(old_cache_daemon.unix_target) as cc:
        got = [int(e["i"]) for e in cc.dataset(NAME, shuffle=True, seed=3).as_numpy_iterator()]
    assert sorted(got) == list(range(N)) and got != list(range(N))


def test_cc_cache_of_the_same_pipeline_reads_the_earlier_cache_instead_of_rewriting_it(
    old_cache_daemon: Daemon,
) -> None:
    with CacheClient(old_cache_daemon.unix_target) as cc:
        before = cc.info(NAME)
        check_exact(cc.cache(tf.data.Dataset.range(N).map(element), NAME, version="fixture-1"))
        after = cc.info(NAME)
    assert after.commit_time == before.commit_time
    assert after.hits == before.hits + 1
