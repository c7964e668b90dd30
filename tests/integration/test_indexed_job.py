"""Materialization as a Kubernetes Indexed Job, against a real S3-compatible server.

Each index is `cacheserver materialize ... --index I --indexes K --store s3://...` run
as its own process, as a Job's pod runs it; moto's server (tests/s3.py, a bucket per
test) is the store, and a real daemon with `--store` reads the result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from daemon import Daemon, env_without_tf_noise, free_port
from s3 import MotoServer, Store
from waits import wait_until

pytest.importorskip("boto3")
tf = pytest.importorskip("tensorflow")

from materializing import PIPELINES, mat_pipelines  # noqa: E402

from cacheserver.catalog import stored  # noqa: E402
from cacheserver.materialize.operation import source_fingerprint  # noqa: E402
from cacheserver.tier.bucket import Bucket  # noqa: E402
from client import CacheClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

BIN = Path(sys.executable).parent
ENTRY = "mat_pipelines:held"
SHARDS, INDEXES = 6, 3


@pytest.fixture
def aws_env(store: Store, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The store's credentials in this process's environment (for Bucket and the daemon)."""
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    return store.env


def _env(credentials: dict[str, str], **extra: str) -> dict[str, str]:
    env = env_without_tf_noise() | credentials | extra
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PIPELINES), str(ROOT), env.get("PYTHONPATH")])
    )
    return env


def _argv(index: int, url: str, endpoint: str, name: str, entry: str = ENTRY) -> list[str]:
    return [
        str(BIN / "cacheserver"),
        "materialize",
        entry,
        "--name",
        name,
        "--shards",
        str(SHARDS),
        "--index",
        str(index),
        "--indexes",
        str(INDEXES),
        "--store",
        url,
        "--store-endpoint",
        endpoint,
    ]


def _index(index: int, store: Store, name: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _argv(index, store.url, store.endpoint, name),
        env=_env(store.env, **env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out + err


def _listing(store: Store) -> dict[str, tuple[int, str, object]]:
    """Every object under the prefix: key -> (size, ETag, last modified)."""
    bucket = Bucket(store.url, store.endpoint)
    out = {}
    for page in bucket.client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket.url.bucket, Prefix=f"{bucket.url.prefix}/"
    ):
        for o in page.get("Contents", []):
            out[o["Key"][len(bucket.url.prefix) + 1 :]] = (o["Size"], o["ETag"], o["LastModified"])
    return out


def _markers(bucket: Bucket, name: str) -> dict[int, stored.ShardMarker]:
    fingerprint = source_fingerprint(ENTRY, b"", SHARDS)
    docs = {s: bucket.get_json(stored.marker_key(name, fingerprint, s)) for s in range(SHARDS)}
    return {s: stored.ShardMarker.from_doc(d) for s, d in docs.items() if d is not None}


def _expected() -> list[dict[str, np.ndarray]]:
    return [
        {k: v.numpy() for k, v in e.items()}
        for s in range(SHARDS)
        for e in mat_pipelines.records(s, SHARDS)
    ]


def test_an_indexed_job_with_an_index_killed_mid_shard_publishes_one_cache_a_daemon_serves(
    store: Store, aws_env: dict[str, str], tmp_path: Path, name: str
) -> None:
    bucket = Bucket(store.url, store.endpoint)
    hold = tmp_path / "hold"
    hold.mkdir()
    # The Job's three pods: index 1 (shards 1 and 4) is caught part way through shard 4.
    procs = {
        i: _index(
            i,
            store,
            name,
            **(
                {mat_pipelines.HOLD_DIR_ENV: str(hold), mat_pipelines.HOLD_SHARDS_ENV: "4"}
                if i == 1
                else {}
            ),
        )
        for i in range(INDEXES)
    }
    wait_until(
        lambda: (hold / "holding-4").exists() or procs[1].poll() is not None,
        240,
        "index 1 holding in shard 4",
    )
    assert procs[1].poll() is None, _finish(procs[1])[1]
    os.killpg(procs[1].pid, signal.SIGKILL)
    code, killed_log = _finish(procs[1])
    assert code == -signal.SIGKILL
    assert "shard 1: published" in killed_log and "shard 4: built" not in killed_log
    for i in (0, 2):
        code, log = _finish(procs[i])
        assert code == 0, log
        assert "published:" not in log  # shard 4 is missing: nobody writes the manifest
    assert bucket.get_json(stored.manifest_key(name)) is None
    assert sorted(_markers(bucket, name)) == [0, 1, 2, 3, 5]

    # A finished index run again redoes nothing: every shard skipped, the store unchanged.
    before = _listing(store)
    code, log = _finish(_index(2, store, name))
    assert code == 0, log
    assert "shard 2: skipped, already published" in log
    assert "shard 5: skipped, already published" in log and "built" not in log
    assert _listing(store) == before

    # What a pod killed between its upload and its marker leaves: an object nothing names.
    stray_file = tmp_path / "data.mdb"
    stray_file.write_bytes(os.urandom(4096))
    stray = bucket.upload(stray_file, stored.object_key(name, stored.new_upload(), 4)).key

    # Kubernetes retries index 1 (backoffLimitPerIndex): shard 1 is kept, shard 4 built.
    code, log = _finish(_index(1, store, name))
    assert code == 0, log
    assert "shard 1: skipped, already published" in log
    assert "shard 4: built" in log and "shard 4: published" in log
    assert f"cache {name!r} published: 135 elements in 6 shards" in log

    keys = _listing(store)
    assert [k for k in keys if k.endswith("manifest.json")] == [stored.manifest_key(name)]
    cache = stored.StoredCache.from_doc(name, bucket.get_json(stored.manifest_key(name)))
    markers = _markers(bucket, name)
    assert sorted(markers) == list(range(SHARDS))
    assert [m.object for m in markers.values()] == cache.objects
    objects = {k for k in keys if k.startswith(f"{name}/objects/")}
    assert objects == {o.key for o in cache.objects} and stray not in keys
    assert cache.record.fingerprint == source_fingerprint(ENTRY, b"", SHARDS)
    assert [s.num_elements for s in cache.record.shards] == [20 + s for s in range(SHARDS)]

    # After the manifest, a rerun of any index finds the cache and changes nothing.
    code, log = _finish(_index(0, store, name))
    assert code == 0 and "nothing to do" in log, log
    assert _listing(store) == keys

    # A daemon with --store serves it, element for element in shard order, and agrees it is
    # what materializing the same entry point would build (no worker runs: resume finds it).
    daemon = Daemon(
        extra_args=(
            "--store",
            store.url,
            "--store-endpoint",
            store.endpoint,
            "--pythonpath",
            str(PIPELINES),
            "--materialize-allow",
            "mat_pipelines",
        )
    ).start()
    try:
        with CacheClient(daemon.unix_target) as cc:
            got = [{k: v.numpy() for k, v in e.items()} for e in cc.dataset(name)]
            expected = _expected()
            assert len(got) == len(expected) == 135
            for g, e in zip(got, expected):
                assert g.keys() == e.keys()
                for k in e:
                    np.testing.assert_array_equal(g[k], e[k])
            done = cc.materialize(ENTRY, name, num_shards=SHARDS, resume=True)
            assert done.num_elements == 135
        assert "materializing cache" not in daemon.log_path.read_text()
    finally:
        daemon.close()


def test_two_attempts_of_one_index_racing_on_a_shard_publish_it_once_and_the_loser_cleans_up(
    store: Store, aws_env: dict[str, str], tmp_path: Path, name: str
) -> None:
    """Two pods of one index (a replacement started while the old pod still runs), both
    holding in shard 0 until both have built most of it: one marker per shard, and the
    attempt whose marker create lost deletes its object."""
    holds = [tmp_path / f"attempt-{a}" for a in range(2)]
    procs = []
    for hold in holds:
        hold.mkdir()
        procs.append(
            _index(
                0,
                store,
                name,
                **{mat_pipelines.HOLD_DIR_ENV: str(hold), mat_pipelines.HOLD_SHARDS_ENV: "0"},
            )
        )
    wait_until(
        lambda: all(
            (h / "holding-0").exists() or p.poll() is not None for h, p in zip(holds, procs)
        ),
        240,
        "both attempts in shard 0",
    )
    for hold in holds:
        (hold / "release").touch()
    logs = [_finish(p) for p in procs]
    assert [code for code, _ in logs] == [0, 0], logs
    assert sum("shard 0: published" in log for _, log in logs) == 1, logs
    assert (
        sum("shard 0: skipped, another attempt published it first" in log for _, log in logs) == 1
    ), logs
    bucket = Bucket(store.url, store.endpoint)
    markers = _markers(bucket, name)
    assert sorted(markers) == [0, 3]
    objects = {k for k in _listing(store) if k.startswith(f"{name}/objects/")}
    assert objects == {m.object.key for m in markers.values()}


@pytest.mark.parametrize(
    "endpoint,bucket,expected,code",
    [
        ("closed-port", "jobs", "cannot be reached", 1),
        ("moto", "no-such-bucket-here", "create the bucket", 3),
    ],
    ids=["store-unreachable", "no-such-bucket"],
)
def test_a_store_that_cannot_be_used_fails_the_index_saying_what_to_do(
    moto_server: MotoServer, endpoint: str, bucket: str, expected: str, code: int, name: str
) -> None:
    url = moto_server.start().endpoint if endpoint == "moto" else f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        _argv(0, f"s3://{bucket}/p", url, name),
        env=_env(moto_server.env()),
        text=True,
        capture_output=True,
        timeout=240,
    )
    assert result.returncode == code, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_an_entry_point_outside_its_module_is_refused_as_the_daemons_workers_refuse_it(
    store: Store, aws_env: dict[str, str], name: str
) -> None:
    result = subprocess.run(
        _argv(0, store.url, store.endpoint, name, entry="mat_pipelines:os.kill"),
        env=_env(store.env),
        text=True,
        capture_output=True,
        timeout=240,
    )
    assert result.returncode == 3, result.stderr
    assert "not defined in an allowed module" in result.stderr
    assert _listing(store) == {}  # refused before anything was written


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--index", "0"], "only work with --store"),
        (["--store", "s3://jobs/p"], "--store needs --index"),
        (
            ["--store", "s3://jobs/p", "--index", "0", "--workers", "2"],
            "--workers talk to a daemon",
        ),
        (["--store", "s3://jobs/p", "--index", "3", "--indexes", "3"], "--index is 3"),
        (["--store", "s3://jobs/p", "--index", "0", "--indexes", "7"], "--indexes is 7"),
        (["--store", "jobs/p", "--index", "0"], "must look like s3://BUCKET/PREFIX"),
    ],
    ids=[
        "index-without-store",
        "store-without-index",
        "daemon-flag",
        "index-out-of-range",
        "more-indexes-than-shards",
        "bad-url",
    ],
)
def test_job_mode_arguments_that_cannot_work_are_refused_before_anything_runs(
    args: list[str], expected: str
) -> None:
    result = subprocess.run(
        [
            str(BIN / "cacheserver"),
            "materialize",
            ENTRY,
            "--name",
            "n",
            "--shards",
            str(SHARDS),
            *args,
        ],
        env=_env({}),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr  # click's usage error
    assert expected in result.stderr and "Traceback" not in result.stderr
