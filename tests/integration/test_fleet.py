"""A fleet of daemons over one object store read as one cache (client/_fleet.py).

Real daemons on loopback addresses of their own, a real S3 server (moto), a
real TensorFlow read: every shard is pulled and served by its rendezvous owner
and by nobody else; a member killed with SIGKILL mid-epoch hands its shards to
their next owners without an element lost or repeated; a member added to the
DNS name mid-job takes over only the shards it now owns.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from daemon import Daemon
from fleet import (
    LoopbackFleet,
    NetnsFleet,
    can_edit_hosts,
    can_make_netns,
    hosts_name,
    metric,
    shards_on,
)
from s3 import MotoServer, Store
from sharded import write_sharded
from waits import LostDaemon, wait_until

from client import CacheClient
from client._fleet import DOWN_SECONDS, ranked

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow

N, DIM = 4000, 240  # ~1 KB elements, 4 MB: about 40 shards of 64 KiB
SMALL_CHUNKS = 1 << 20  # prefetch_bytes: reads in ~128 KiB chunks, so an epoch is many calls
# direct=False: every member runs on this host, so reads would go to their files, and
# neither a killed member nor a cut link would stop them (test_members_on_this_host...)
OVER_GRPC = {"prefetch_bytes": SMALL_CHUNKS, "direct": False}


def source():
    rng = np.random.default_rng(7)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((data, np.arange(N)))


def ids(ds) -> list[int]:
    return [int(i) for _, i in ds]


def publish(store: Store, name: str, shard_bytes: int = 64 << 10) -> tuple[str, int]:
    """A cache of about 40 shards, written on a daemon of its own and published to the store;
    its name and shard count."""
    url, endpoint, env = store
    builder = Daemon(
        extra_args=("--store", url, "--store-endpoint", endpoint), env={**os.environ, **env}
    ).start()
    try:
        with CacheClient(builder.unix_target) as cc:
            cache = write_sharded(
                cc,
                source(),
                name,
                shard_bytes=shard_bytes,
                chunk_bytes=min(32 << 10, shard_bytes),
                batch_elements=min(64, shard_bytes >> 10),
            )
            wait_until(
                lambda: cc.info(name).store_state == "STORED",
                60,
                lambda: f"cache {name} not stored: {cc.info(name)}",
            )
        return name, len(cache.shards)
    finally:
        builder.close()


@pytest.fixture(scope="module")
def fleet_store(moto_server: MotoServer) -> Store:
    """One bucket for this module's loopback fleets, which only read from it."""
    return moto_server.start().store()


@pytest.fixture(scope="module")
def published(fleet_store: Store) -> tuple[str, int]:
    """The cache the fleets read, published once: each test's members start empty and pull
    what they serve from the store, so their shards and metrics are the test's own."""
    return publish(fleet_store, f"fleet-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def fleet(fleet_store: Store) -> Iterator[LoopbackFleet]:
    f = LoopbackFleet(fleet_store)
    try:
        for _ in range(4):
            f.add()
        yield f
    finally:
        f.close()


def owners(fleet: LoopbackFleet | NetnsFleet, name: str, shards: int) -> dict[str, set[int]]:
    members = fleet.targets
    owned: dict[str, set[int]] = {m: set() for m in members}
    for s in range(shards):
        owned[ranked(members, name, s)[0]].add(s)
    return owned


def test_every_shard_is_served_by_its_owner_only(published, fleet) -> None:
    name, shards = published
    assert shards >= 32
    with CacheClient(targets=fleet.targets) as cc:
        assert ids(cc.dataset(name, **OVER_GRPC)) == list(range(N))
        shuffled = ids(cc.dataset(name, shuffle=True, seed=3, **OVER_GRPC))
        # cc.numpy() reads the same chunks from the same owners, without TensorFlow
        assert [int(i) for _, i in cc.numpy(name, shuffle=True, seed=3, **OVER_GRPC)] == shuffled
    assert sorted(shuffled) == list(range(N)) and shuffled != list(range(N))
    want = owners(fleet, name, shards)
    assert all(want.values())  # every member owns some
    for d in fleet.members:
        assert shards_on(d, name) == want[d.tcp_target], d.tcp_target
    # the same order as one daemon reading the whole cache
    with CacheClient(fleet.members[0].unix_target) as one:
        assert ids(one.dataset(name, shuffle=True, seed=3)) == shuffled


def test_chunks_of_many_small_shards_stay_within_each_members_stream_limit(
    fleet_store, name, fleet
) -> None:
    """A chunk spanning hundreds of shards sends their calls ahead, but never more than a
    member admits from one client (--max-streams-per-client, 48 by default)."""
    small, shards = publish(fleet_store, name, shard_bytes=8 << 10)
    assert shards > 200
    with CacheClient(targets=fleet.targets[:1]) as cc:  # one member owns every shard
        assert ids(cc.dataset(small, parallel_shards=16, direct=False)) == list(range(N))


def test_a_member_killed_mid_epoch_loses_and_repeats_nothing(published, fleet) -> None:
    name, shards = published
    victim = fleet.members[1]
    lost = owners(fleet, name, shards)[victim.tcp_target]
    for shuffle in (False, True):
        seen = []
        with CacheClient(targets=fleet.targets) as cc:
            ds = cc.dataset(name, shuffle=shuffle, seed=5, **OVER_GRPC, parallel_shards=1)
            for i, element in enumerate(ds):
                seen.append(int(element[1]))
                if i == N // 10 and victim.alive():
                    victim.kill()
        if shuffle:
            assert sorted(seen) == list(range(N)) and seen != list(range(N))
        else:
            assert seen == list(range(N))
    # the next owners pulled the victim's shards: each from the store, once
    alive = [d for d in fleet.members if d is not victim]
    for s in lost:
        nxt = ranked(fleet.targets, name, s)[1]
        assert s in shards_on(next(d for d in alive if d.tcp_target == nxt), name)


def test_a_member_that_comes_back_serves_its_shards_again(published, fleet) -> None:
    name, _ = published
    victim = fleet.members[2]
    served = ('shardcache_read_bytes_total{plane="data"}', "shardcache_read_elements_total")

    def epoch(cc: CacheClient) -> dict[str, tuple[float, float]]:
        """Each live member's (bytes over its data plane, elements) served for one epoch."""
        before = {d.tcp_target: [metric(d, m) for m in served] for d in fleet.members if d.alive()}
        assert ids(cc.dataset(name, **OVER_GRPC)) == list(range(N))
        return {
            d.tcp_target: tuple(
                metric(d, m) - was  # type: ignore[misc]
                for m, was in zip(served, before[d.tcp_target])
            )
            for d in fleet.members
            if d.alive()
        }

    with CacheClient(targets=fleet.targets) as cc:
        healthy = epoch(cc)
        assert all(b and c for b, c in healthy.values())
        victim.kill()
        without = epoch(cc)
        assert victim.tcp_target not in without
        # its bytes and elements, served by the others, and nothing twice: the calls sent ahead
        # to them when the victim's call failed are read, not cancelled and sent again
        assert (
            np.sum(list(without.values()), 0).tolist() == np.sum(list(healthy.values()), 0).tolist()
        )
        victim.start()
        time.sleep(DOWN_SECONDS + 0.5)  # then it is tried again
        assert epoch(cc) == healthy  # byte for byte, each member its own shards again


def test_members_on_this_host_are_read_from_their_files(published, fleet) -> None:
    name, shards = published
    with CacheClient(targets=fleet.targets) as cc:
        assert ids(cc.dataset(name, prefetch_bytes=SMALL_CHUNKS)) == list(range(N))
        shuffled = ids(cc.dataset(name, shuffle=True, seed=3, prefetch_bytes=SMALL_CHUNKS))
    assert sorted(shuffled) == list(range(N))
    want = owners(fleet, name, shards)
    for d in fleet.members:
        assert shards_on(d, name) == want[d.tcp_target]  # leased: its own shards only
        assert metric(d, "shardcache_direct_reads_total") == 2  # a lease per pass
        assert metric(d, "shardcache_read_bytes_total") == 0  # nothing went over the wire
    with CacheClient(fleet.members[0].unix_target) as one:
        assert ids(one.dataset(name, shuffle=True, seed=3, direct=False)) == shuffled


@pytest.mark.skipif(not can_edit_hosts(), reason="needs to write /etc/hosts (root)")
def test_a_member_added_mid_job_takes_only_the_shards_it_now_owns(
    published, fleet, monkeypatch
) -> None:
    name, shards = published
    monkeypatch.setenv("SHARDCACHE_RESOLVE_SECONDS", "0.5")
    dns = f"fleet-{os.getpid()}.shardcache.invalid"
    with (
        hosts_name(dns, [t.rsplit(":", 1)[0] for t in fleet.targets]) as hosts,
        CacheClient(targets=f"dns:///{dns}:{fleet.port}") as cc,
    ):
        ds = cc.dataset(name, **OVER_GRPC)
        assert ids(ds) == list(range(N))
        before = {d.tcp_target: shards_on(d, name) for d in fleet.members}
        assert before == owners(fleet, name, shards)
        added = fleet.add()
        hosts.set([t.rsplit(":", 1)[0] for t in fleet.targets])
        time.sleep(1)
        assert ids(ds) == list(range(N))  # the next epoch, same dataset
    now = owners(fleet, name, shards)
    taken = now[added.tcp_target]
    assert shards_on(added, name) == taken
    assert 0 < len(taken) < shards / 2
    for member, had in before.items():
        assert now[member] <= had  # nothing moved between the members already there
        assert (
            shards_on(next(d for d in fleet.members if d.tcp_target == member), name) == had
        )  # and none of them pulled anything new


@pytest.fixture(scope="module")
def open_moto() -> Iterator[MotoServer]:
    """A moto server on every address: members in network namespaces reach it too."""
    with MotoServer(host="0.0.0.0") as server:
        yield server


@pytest.mark.skipif(not can_make_netns(), reason="needs root and `ip netns`")
def test_a_member_whose_link_goes_down_mid_epoch_loses_and_repeats_nothing(open_moto, name) -> None:
    store = open_moto.store()
    url, _, env = store
    fleet = NetnsFleet(open_moto.port, env, url)
    try:
        for _ in range(4):
            fleet.add()
        published_name, shards = publish(store, name)
        cut = owners(fleet, published_name, shards)[fleet.targets[2]]
        assert cut
        for shuffle in (False, True):
            fleet.link(2, up=True)
            seen = []
            with CacheClient(targets=fleet.targets) as cc:
                ds = cc.dataset(
                    published_name, shuffle=shuffle, seed=9, **OVER_GRPC, parallel_shards=1
                )
                for i, element in enumerate(ds):
                    seen.append(int(element[1]))
                    if i == N // 10:
                        fleet.link(2, up=False)
            assert sorted(seen) == list(range(N))
            assert (seen == list(range(N))) is not shuffle
        # the cut member's shards were read from their next owners
        for s in cut:
            nxt = ranked(fleet.targets, published_name, s)[1]
            member = next(d for d in fleet.members if d.tcp_target == nxt)
            assert s in shards_on(member, published_name)
    finally:
        fleet.close()


@pytest.mark.skipif(not can_make_netns(), reason="needs root and `ip netns`")
def test_one_daemons_link_cut_mid_chunk_loses_and_repeats_nothing(open_moto, name) -> None:
    """One daemon (a single target: no fleet to fail over to), read over its data plane at
    50 Mbit/s so that a cut lands inside a chunk; the link comes back once the client
    noticed, and the read picks up where it stopped."""
    store = open_moto.store()
    url, _, env = store
    fleet = NetnsFleet(open_moto.port, env, url, metrics=True)
    try:
        fleet.add()
        published_name, _ = publish(store, name)
        fleet.rate(0, 50)
        watcher = LostDaemon()
        logging.getLogger("client").addHandler(watcher)
        seen: list[int] = []
        with CacheClient(fleet.targets[0]) as cc:
            ds = cc.dataset(published_name, **OVER_GRPC, parallel_shards=1, reconnect_timeout=120)
            assert ids(ds) == list(range(N))  # the member pulls everything it serves
            for i, element in enumerate(ds):
                seen.append(int(element[1]))
                if i == N // 10:
                    fleet.link(0, up=False)
                    threading.Thread(target=_restore, args=(fleet, watcher), daemon=True).start()
        assert watcher.lost.is_set(), "the cut was never noticed"
        assert seen == list(range(N))
        assert metric(fleet.members[0], 'shardcache_read_bytes_total{plane="data"}') > 0
    finally:
        logging.getLogger("client").removeHandler(watcher)
        fleet.close()


def _restore(fleet: NetnsFleet, watcher: LostDaemon) -> None:
    watcher.lost.wait(60)
    fleet.link(0, up=True)
