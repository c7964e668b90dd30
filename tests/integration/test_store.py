"""The object-store tier: daemons with --store over a real S3-compatible server.

Publish and pull round trips element by element, one GET per shard object
however many readers, racing publishers, kill -9 mid-upload and mid-pull, a
flipped byte in a stored object, an unreachable store, eviction that keeps the
only copy. The servers are real (tests/s3.py): moto's server mode, and
SeaweedFS (master, volume, filer, S3 gateway) for one end-to-end test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import stores
from daemon import Daemon
from sharded import write_sharded
from stores import N, elements, publish, s3, source, store_daemon, wait_for
from waits import gone, wait_until

from cacheserver.catalog.lookups import LOOKUP_TTL_S
from client import (
    CacheClient,
    CapacityExceededError,
    DataLossError,
    FingerprintMismatchError,
)

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow
daemons = stores.daemons  # the fixture


def keys(store, prefix: str) -> list[str]:
    """Keys under prefix (relative to the store's prefix), listed with boto3."""
    client, bucket, base = s3(store)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=base + prefix).get("Contents", [])
    return [o["Key"][len(base) :] for o in listed]


def flip_byte(store, key: str, offset: int) -> None:
    """Corrupt one byte of a stored object, in the store."""
    client, bucket, base = s3(store)
    data = bytearray(client.get_object(Bucket=bucket, Key=base + key)["Body"].read())
    data[offset] ^= 0xFF
    client.put_object(Bucket=bucket, Key=base + key, Body=bytes(data))


@contextlib.contextmanager
def store_down(server) -> Iterator[None]:
    """The S3 server stopped for the block, then started again (empty, its buckets made)."""
    server.stop()
    try:
        yield
    finally:
        server.start()


def test_a_cache_built_once_is_read_on_a_daemon_that_never_saw_the_pipeline(
    store, moto_server, daemons, name
) -> None:
    publish(store, daemons, name)
    b = store_daemon(store)
    daemons.append(b)
    with CacheClient(b.unix_target) as cc:
        assert [c.name for c in cc.list()] == []
        listed = {c.name: c for c in cc.list(store=True)}
        assert listed[name].store_state == "REMOTE" and listed[name].num_elements == N
        got = elements(cc.dataset(name))
        info = wait_for(cc, name, "STORED")
    assert got == elements(source())
    assert info.num_shards >= 4 and info.state == "READY"
    # whole on B's disk now: a restart serves it locally, without the store
    b.restart()
    gets = moto_server.requests("GET", f"{name}/objects/")
    with CacheClient(b.unix_target) as cc:
        assert elements(cc.dataset(name, shuffle=True, seed=1)) != got
        assert sorted(elements(cc.dataset(name, shuffle=True, seed=1))) == sorted(got)
    assert moto_server.requests("GET", f"{name}/objects/") == gets


def test_the_store_sees_one_get_per_shard_object_however_many_readers(
    store, moto_server, daemons, name
) -> None:
    publish(store, daemons, name)
    b = store_daemon(store)
    daemons.append(b)
    import threading

    results: list[list] = []

    def read() -> None:
        with CacheClient(b.unix_target) as cc:
            results.append(elements(cc.dataset(name, parallel_shards=4)))

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(120)
    assert len(results) == 4 and all(r == elements(source()) for r in results)
    with CacheClient(b.unix_target) as cc:
        shards = cc.info(name).num_shards
    gets = moto_server.requests("GET", f"{name}/objects/")
    assert len(gets) == shards and len(set(gets)) == shards, gets


def test_cc_cache_on_a_second_daemon_reads_the_stored_cache_without_running_the_pipeline(
    store, daemons, name, tmp_path: Path
) -> None:
    a = store_daemon(store)
    daemons.append(a)
    runs = tmp_path / "runs"

    def counted(i):  # a side effect per element the source produces
        with runs.open("a") as f:
            f.write(".")
        return i

    ds = (
        tf.data.Dataset.range(500)
        .map(lambda i: tf.numpy_function(counted, [i], tf.int64, stateful=True))
        .map(lambda i: tf.ensure_shape(i, []))
    )
    with CacheClient(a.unix_target) as cc:
        first = [int(x) for x in cc.cache(ds, name, version="v1")]
        wait_for(cc, name, "STORED")
    assert runs.read_text() == "." * 500
    b = store_daemon(store)
    daemons.append(b)
    with CacheClient(b.unix_target) as cc:
        assert [int(x) for x in cc.cache(ds, name, version="v1")] == first
        with pytest.raises(FingerprintMismatchError, match="different pipeline"):
            iter(cc.cache(ds, name, version="v2"))
    assert runs.read_text() == "." * 500  # zero recomputation on B


def test_two_publishers_of_one_name_leave_exactly_one_cache(
    store, moto_server, daemons, name
) -> None:
    a, b = store_daemon(store), store_daemon(store)
    daemons += [a, b]

    def write(d: Daemon) -> None:
        with CacheClient(d.unix_target) as cc:
            write_sharded(cc, source(), name, shard_bytes=768 << 10, chunk_bytes=64 << 10)

    # the same pipeline on both at once: one after the other, the second WriteBegin can
    # find the first already published and read it instead of writing (not a race then)
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(write, d) for d in (a, b)]:
            done.result()
    for d in (a, b):
        with CacheClient(d.unix_target) as cc:
            wait_for(cc, name, "STORED")
    found = keys(store, f"{name}/")
    manifests = [k for k in found if k.endswith("manifest.json")]
    uploads = {k.split("/")[2] for k in found if "/objects/" in k}
    assert len(manifests) == 1 and len(uploads) == 1, found  # the loser deleted its objects
    c = store_daemon(store)
    daemons.append(c)
    with CacheClient(c.unix_target) as cc:
        assert elements(cc.dataset(name)) == elements(source())


def test_a_different_cache_of_the_same_name_is_not_published_over_the_stored_one(
    store, daemons, name
) -> None:
    publish(store, daemons, name)
    b = store_daemon(store, "--store-endpoint", "http://127.0.0.1:9")  # cannot look first
    daemons.append(b)
    with CacheClient(b.unix_target) as cc:
        write_sharded(cc, source(100, seed=7), name, shard_bytes=1 << 20, version="other")
    b.stop()
    b2 = store_daemon(store, data_dir=b.data_dir)
    daemons.append(b2)
    with CacheClient(b2.unix_target) as cc:
        info = wait_for(cc, name, "CONFLICT")
        assert "rm --store" in info.store_detail
        assert elements(cc.dataset(name)) == elements(source(100, seed=7))  # still served


def test_kill_9_mid_upload_never_shows_a_partial_cache_and_the_restart_finishes(
    store, moto_server, daemons, name
) -> None:
    a = store_daemon(store)
    daemons.append(a)
    big = 40_000  # 80 MB: one multipart shard and several smaller ones
    with CacheClient(a.unix_target) as cc:
        write_sharded(cc, source(big), name, shard_bytes=24 << 20, chunk_bytes=1 << 20)
        wait_until(
            lambda: cc.info(name).store_done_bytes >= (8 << 20), 60, "8 MiB of the cache uploaded"
        )
    a.kill()
    assert not [k for k in keys(store, f"{name}/") if k.endswith("manifest.json")]
    other = store_daemon(store)
    daemons.append(other)
    with CacheClient(other.unix_target) as cc, pytest.raises(Exception, match="not found"):
        cc.info(name)
    a.start()
    with CacheClient(a.unix_target) as cc:
        wait_for(cc, name, "STORED", timeout=120)
    assert "to publish" in a.log()
    with CacheClient(other.unix_target) as cc:  # it keeps "not in the store" LOOKUP_TTL_S
        wait_until(lambda: not gone(cc, name), LOOKUP_TTL_S + 30, "the published cache")
        assert elements(cc.dataset(name)) == elements(source(big))


def test_kill_9_mid_pull_discards_the_partial_copy_and_the_restart_pulls_again(
    store, daemons, name
) -> None:
    publish(store, daemons, name, shard_bytes=4 << 20, n=40_000)
    b = store_daemon(store)
    daemons.append(b)
    with CacheClient(b.unix_target) as cc:  # over gRPC: direct readers wait for the pull
        it = iter(cc.dataset(name, direct=False, reconnect_timeout=1))
        next(it)
        assert cc.info(name).store_state == "PULLING"
        b.kill()
        with pytest.raises(Exception, match=r"reach|UNAVAILABLE|unavailable"):
            list(it)
        del it
    assert not (b.data_dir / "caches" / name / "manifest.json").exists()
    b.start()
    with CacheClient(b.unix_target) as cc:
        assert cc.list() == []
        assert elements(cc.dataset(name)) == elements(source(40_000))


def test_a_flipped_byte_in_a_stored_object_is_data_loss_never_served(
    store, moto_server, daemons, name
) -> None:
    publish(store, daemons, name)
    key = sorted(keys(store, f"{name}/objects/"))[2]
    flip_byte(store, key, 4096 + 17)
    b = store_daemon(store)
    daemons.append(b)
    with CacheClient(b.unix_target) as cc:
        for _ in range(2):  # asked again: still refused, nothing fetched or served
            with pytest.raises((DataLossError, tf.errors.OpError), match="is corrupt"):
                elements(cc.dataset(name))
    shard = int(key.rsplit("-", 1)[1].split(".")[0])
    assert not (b.data_dir / "caches" / name / f"shard-{shard:05d}" / "data.mdb").exists()


def test_an_unreachable_store_does_not_stop_local_caches_and_publishing_resumes(
    store, moto_server, daemons, name
) -> None:
    with store_down(moto_server):
        a = store_daemon(store)
        daemons.append(a)
        with CacheClient(a.unix_target) as cc:
            first = [int(x) for x in cc.cache(tf.data.Dataset.range(1000), name)]
            assert [int(x) for x in cc.cache(tf.data.Dataset.range(1000), name)] == first
            # the publish is queued at the commit; its first try fails soon after, not at once
            wait_until(
                lambda: "retrying" in cc.info(name).store_detail,
                what=lambda: f"a failed publish ({cc.info(name).store_detail!r})",
            )
            info = cc.info(name)
            assert info.store_state == "LOCAL" and "retrying" in info.store_detail
    with CacheClient(a.unix_target) as cc:
        wait_for(cc, name, "STORED", timeout=90)
    assert a.log().count("failed (attempt") >= 1 and "retrying in" in a.log()


def test_eviction_keeps_the_only_copy_until_the_store_holds_it(
    store, moto_server, daemons, name
) -> None:
    with store_down(moto_server):
        first = store_daemon(store)
        daemons.append(first)
        with CacheClient(first.unix_target) as cc:
            write_sharded(cc, source(), f"{name}-1", shard_bytes=1 << 20)
            room = cc.info(f"{name}-1").disk_bytes + (1 << 20)  # one cache, not two
        first.stop()
        a = store_daemon(store, "--max-bytes", str(room), data_dir=first.data_dir)
        daemons.append(a)
        with CacheClient(a.unix_target) as cc:
            with pytest.raises(CapacityExceededError, match="no room"):
                write_sharded(cc, source(seed=1), f"{name}-2", shard_bytes=1 << 20)
            assert [c.name for c in cc.list()] == [f"{name}-1"]  # the only copy: kept
    with CacheClient(a.unix_target) as cc:
        wait_for(cc, f"{name}-1", "STORED", timeout=90)
        write_sharded(cc, source(seed=1), f"{name}-2", shard_bytes=1 << 20)  # evicts -1 now
        assert [c.name for c in cc.list()] == [f"{name}-2"]
        wait_for(cc, f"{name}-2", "STORED")  # evictable in turn, to make room for the pull
        assert elements(cc.dataset(f"{name}-1")) == elements(source())  # pulled back
        assert [c.name for c in cc.list()] == [f"{name}-1"]


def test_rm_says_which_copies_it_removed(store, daemons, name) -> None:
    a = publish(store, daemons, name)
    with CacheClient(a.unix_target) as cc:
        assert cc.delete(name) == (True, False)
        assert cc.info(name).store_state == "REMOTE"
        assert cc.delete(name, store=True) == (False, True)
        assert [c.name for c in cc.list(store=True)] == []


def test_round_trip_through_seaweedfs(seaweedfs, daemons, name) -> None:
    store = seaweedfs.store()
    publish(store, daemons, name)
    b = store_daemon(store)
    daemons.append(b)
    with CacheClient(b.unix_target) as cc:
        assert elements(cc.dataset(name)) == elements(source())
