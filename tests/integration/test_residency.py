"""Caches larger than the daemon's room: a stable resident subset, the rest streamed.

One cache of 16 small shards is published to a real moto server; reader daemons whose
--max-bytes holds about half of it (or a tenth) pull it: they keep the shards admitted
while there was room and stream the others through a window of a few shards for each
pass. Every pass reads every element exactly once; from the second pass on, the store
is asked for the streamed shards only (counted by the daemon and checked against the
server's own access log, on moto and on SeaweedFS), never for the resident ones. A reader
process killed mid-pass resumes from its saved state in a new one, and the daemon's
window holds nothing for the dead one afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from daemon import Daemon, env_without_tf_noise, free_port
from exposition import scrape
from fleet import LoopbackFleet
from s3 import S3Server
from sharded import write_sharded
from stores import source, store_daemon, wait_for
from waits import wait_until

from cacheserver.catalog.window import WINDOW_SLOTS
from client import CacheClient
from client.errors import ShardcacheError
from client.wire.v1 import cache_service_pb2 as pb

pytestmark = pytest.mark.slow
tf = pytest.importorskip("tensorflow")

NAME = "larger"
N = 512  # 2 KiB elements: 1 MiB of records in 16 shards (LMDB files of ~150 KB)
SHARD_BYTES = 16 << 10


@pytest.fixture(scope="module")
def published(moto_server: S3Server) -> Iterator[tuple[Any, int]]:
    """(the store, the cache's bytes in it), published once to moto."""
    yield from publish(moto_server)


@pytest.fixture(scope="module")
def published_on_seaweedfs(seaweedfs: S3Server) -> Iterator[tuple[Any, int]]:
    """The same, published to SeaweedFS."""
    yield from publish(seaweedfs)


#: The servers the access-log test runs on, and the fixture publishing the cache on each.
SERVERS = ["moto_server", pytest.param("seaweedfs", marks=pytest.mark.slow)]
PUBLISHED = {"moto_server": "published", "seaweedfs": "published_on_seaweedfs"}


def publish(server: S3Server) -> Iterator[tuple[Any, int]]:
    """(the store, the cache's bytes in it): the cache written by a daemon over a fresh
    bucket of server, once the store holds it (the daemon then gone)."""
    store = server.start().store()
    started: list[Daemon] = []
    try:
        a = store_daemon(store)
        started.append(a)
        with CacheClient(a.unix_target) as cc:
            write_sharded(cc, source(N), NAME, SHARD_BYTES, chunk_bytes=64 << 10, batch_elements=16)
            info = wait_for(cc, NAME, "STORED")
        assert info.num_shards == 16
        total = info.store_total_bytes
        started.pop().close()
        yield store, total
    finally:
        for d in started:
            d.close()


@contextlib.contextmanager
def reader(store: Any, max_bytes: int, *args: str) -> Iterator[tuple[Daemon, CacheClient]]:
    """A daemon over store with --max-bytes max_bytes, and a client of it."""
    d = store_daemon(store, "--max-bytes", str(max_bytes), *args)
    try:
        with CacheClient(d.unix_target) as cc:
            yield d, cc
    finally:
        d.close()


def labels(ds: Any) -> list[int]:
    return [int(i) for _, i in ds]


def epoch(cc: CacheClient, e: int, workers: int = 2, **options: Any) -> list[int]:
    """Every worker's share of epoch e, shuffled by shards, as labels."""
    got: list[int] = []
    for w in range(workers):
        got += labels(
            cc.dataset(
                NAME,
                shuffle="shards",
                seed=7,
                num_workers=workers,
                worker_index=w,
                epoch=e,
                **options,
            )
        )
    return got


def gets(cc: CacheClient) -> int:
    return cc.info(NAME).store_requests.get("GET", 0)


def logged_gets(server: S3Server, store: Any) -> int:
    """The GETs of the cache's objects in server's access log, once every request made so
    far is in it (the server writes its log behind its answers: a request of a key of our
    own, waited for, comes after them)."""
    bucket = store.url.removeprefix("s3://").partition("/")[0]
    mark = f"tier/log-mark-{uuid.uuid4().hex}"
    with contextlib.suppress(ClientError):  # 404: only the log line matters
        server.client().get_object(Bucket=bucket, Key=mark)
    wait_until(lambda: any(r.key == mark for r in server.access_log()), 30, f"{mark} in the log")
    return sum(
        1
        for r in server.access_log()
        if r.bucket == bucket and r.method == "GET" and r.key.startswith(f"tier/{NAME}/")
    )


@pytest.mark.parametrize("server", SERVERS)
def test_a_cache_twice_the_room_reads_exactly_and_streams_only_its_other_shards(
    server: str, request: pytest.FixtureRequest
) -> None:
    s3: S3Server = request.getfixturevalue(server)
    store, total = request.getfixturevalue(PUBLISHED[server])
    port = free_port()
    before = logged_gets(s3, store)
    with reader(store, total // 2, "--metrics-listen", f"127.0.0.1:{port}") as (d, cc):
        per_epoch = []
        for e in range(3):
            start = gets(cc)
            got = epoch(cc, e)
            assert sorted(got) == list(range(N)), f"epoch {e}: not every element exactly once"
            per_epoch.append(gets(cc) - start)
        info = cc.info(NAME)
        streamed = info.num_shards - info.resident_shards
        assert 0 < info.resident_shards < info.num_shards
        assert info.resident_bytes <= total // 2
        # the first epoch: the manifest, then every shard once (resident or streamed)
        assert per_epoch[0] <= 1 + info.num_shards + 1
        # epochs 2 and 3 fetch the streamed shards once each, a few not at all (still in
        # the window from the epoch before) or, at most one, twice (the one the two shares
        # split): never the resident ones, never the whole cache
        for n in per_epoch[1:]:
            assert streamed - 4 <= n <= streamed + 1, (per_epoch, streamed)
        # the daemon's count is the store's
        assert gets(cc) == logged_gets(s3, store) - before
        assert info.store_streamed_bytes > 0 and 0 < info.hit_ratio < 1
        shown = subprocess.run(
            [sys.executable, "-m", "cacheserver", "info", NAME, "--target", d.unix_target],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert f"resident     {info.resident_shards} of 16 shards" in shown
        assert "partially resident" in shown and "hit ratio 0." in shown
        assert re.search(r"\nwindow +\d streamed shards held \(.+\), \d reads using them", shown)
        got = scrape(f"http://127.0.0.1:{port}/metrics")
        cache = (("cache", NAME),)
        assert got[("shardcache_cache_resident_shards", cache)] == info.resident_shards
        assert got[("shardcache_cache_streamed_bytes_total", cache)] >= info.store_streamed_bytes
        assert 0 < got[("shardcache_cache_hit_ratio", cache)] < 1


def test_the_resident_subset_is_stable_across_passes(published) -> None:
    store, total = published
    with reader(store, total // 2) as (_, cc):
        epoch(cc, 0, workers=1)
        first = cc.info(NAME)
        for e in (1, 2):
            epoch(cc, e, workers=1, direct=False)
        then = cc.info(NAME)
    assert then.resident_shards == first.resident_shards
    assert then.resident_bytes == first.resident_bytes


def test_a_cache_ten_times_the_room_still_reads_exactly(published) -> None:
    store, total = published
    with reader(store, total // 10) as (_, cc):
        for e in range(2):
            assert sorted(epoch(cc, e)) == list(range(N))
        assert sorted(labels(cc.dataset(NAME, shuffle=True, seed=3, direct=False))) == list(
            range(N)
        )
        assert labels(cc.dataset(NAME)) == list(range(N))  # the stored order
        info = cc.info(NAME)
    assert info.resident_shards < info.num_shards // 4


def test_a_partially_resident_cache_cannot_be_pinned(published) -> None:
    store, total = published
    with reader(store, total // 2) as (_, cc):
        epoch(cc, 0, workers=1)
        with pytest.raises(ShardcacheError, match="cannot be pinned"):
            cc.pin(NAME)


def test_room_an_eviction_frees_is_filled_by_the_partial_cache(published) -> None:
    store, total = published
    with reader(store, total // 2) as (_, cc):
        write_sharded(cc, source(N // 4, seed=1), "other", shard_bytes=SHARD_BYTES)
        wait_for(cc, "other", "STORED")  # evictable from now on, but pinned:
        cc.pin("other")
        assert sorted(epoch(cc, 0, workers=1)) == list(range(N))
        crowded = cc.info(NAME).resident_shards
        cc.unpin("other")
        assert sorted(epoch(cc, 1, workers=1)) == list(range(N))
        roomier = cc.info(NAME).resident_shards
        left = [c.name for c in cc.list()]
    assert "other" not in left  # evicted, least recently read, for the partial cache's room
    assert roomier > crowded


def test_a_pass_survives_the_daemon_killed_mid_stream(published) -> None:
    store, total = published
    with reader(store, total // 2) as (d, cc):
        epoch(cc, 0, workers=1)  # the resident subset is in place
        it = iter(cc.dataset(NAME, shuffle="shards", seed=7, epoch=1, parallel_shards=1))
        got = [int(next(it)[1]) for _ in range(N // 4)]
        d.restart()  # kill -9, then a new daemon on the same socket and data dir
        got += [int(i) for _, i in it]
    assert sorted(got) == list(range(N))


#: A reader process of one pass of NAME: "read" EPOCH KILL_AT saves its state and the
#: labels read every SAVE_EVERY elements to PATH, and kills itself (SIGKILL) after KILL_AT
#: elements; "resume" reads the rest of the pass from the state in PATH, printing labels.
_READER = textwrap.dedent(
    """
    import json, os, signal, sys
    from client import CacheClient, ReadState

    target, name, mode, path = sys.argv[1:5]
    order = {"shuffle": "shards", "seed": 7}
    with CacheClient(target) as cc:
        if mode == "resume":
            state = ReadState.from_json(json.loads(open(path).read())["state"])
            print(json.dumps([int(i) for _, i in cc.dataset(name, resume=state, **order)]))
            sys.exit(0)
        epoch, kill_at, every = map(int, sys.argv[5:8])
        share = cc.info(name).num_elements
        got = []
        for _, i in cc.dataset(name, epoch=epoch, **order):
            got.append(int(i))
            if len(got) % every == 0:
                state = cc.read_state(name, elements_seen=epoch * share + len(got), **order)
                with open(path + ".tmp", "w") as f:
                    json.dump({"state": state.to_json(), "labels": got}, f)
                os.replace(path + ".tmp", path)
            if len(got) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    """
)
KILL_AT, SAVE_EVERY = N // 2 + 20, 40


def read_in_process(target: str, mode: str, path: Path, *args: int) -> subprocess.CompletedProcess:
    env = {**env_without_tf_noise(), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", _READER, target, NAME, mode, str(path), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_reader_killed_mid_pass_resumes_exactly_and_leaves_the_window_free(
    published, tmp_path
) -> None:
    """A direct reader (resident shards from their files, streamed ones through the
    daemon's window) is SIGKILLed mid-pass; a new process resumes from its last saved state:
    the labels saved with that state and the new process's are the pass, each once. The
    daemon ends the dead reader's streams and lease, and no read uses the window any more;
    it keeps at most its slots, each counted in the capacity for exactly its files, and
    gives them all back when the cache goes."""
    store, total = published
    port = free_port()
    args = ("--lease-ttl", "1", "--metrics-listen", f"127.0.0.1:{port}")
    with reader(store, total // 2, *args) as (d, cc):
        epoch(cc, 0, workers=1)  # the resident subset in place: epoch 1 streams the others
        assert 0 < cc.info(NAME).resident_shards < cc.info(NAME).num_shards
        saved = tmp_path / "state.json"
        killed = read_in_process(d.unix_target, "read", saved, 1, KILL_AT, SAVE_EVERY)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        done = json.loads(saved.read_text())["labels"]
        assert len(done) == KILL_AT // SAVE_EVERY * SAVE_EVERY
        resumed = read_in_process(d.unix_target, "resume", saved)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        rest = json.loads(resumed.stdout.splitlines()[-1])
        assert sorted(done + rest) == list(range(N)), "not every element of the pass once"

        def metrics() -> dict[str, float]:
            got = scrape(f"http://127.0.0.1:{port}/metrics")
            return {
                "read streams": got[("shardcache_active_streams", (("kind", "read"),))],
                "data connections": got[("shardcache_data_connections", ())],
                "direct leases": cc.info(NAME).direct_leases,
                "reads in the window": cc.info(NAME).window_reads,
            }

        wait_until(lambda: not any(metrics().values()), 30, lambda: f"{metrics()} all 0")
        info = cc.info(NAME)
        window = d.data_dir / "caches" / NAME / "stream"
        slots = list(window.iterdir())
        assert 0 < len(slots) <= WINDOW_SLOTS
        window_bytes = sum(f.stat().st_size for slot in slots for f in slot.iterdir())
        assert (info.window_shards, info.window_bytes) == (len(slots), window_bytes)
        disk = scrape(f"http://127.0.0.1:{port}/metrics")[("shardcache_disk_bytes", ())]
        assert disk == info.resident_bytes + window_bytes  # no reservation left behind
        assert cc.delete(NAME) == (True, False)
        assert scrape(f"http://127.0.0.1:{port}/metrics")[("shardcache_disk_bytes", ())] == 0
        assert not window.exists()


def test_a_fleet_whose_members_hold_less_than_their_shares_reads_exactly(published) -> None:
    store, total = published
    fleet = LoopbackFleet(store, extra_args=("--max-bytes", str(total // 4)))
    try:
        for _ in range(3):
            fleet.add()
        with CacheClient(targets=fleet.targets) as cc:
            for e in range(2):
                assert sorted(epoch(cc, e)) == list(range(N)), f"epoch {e}"
        infos = []
        for d in fleet.members:
            with CacheClient(d.unix_target) as one:
                infos.append(one.info(NAME))
    finally:
        fleet.close()
    # each member streamed what did not fit of the shards it owns
    assert sum(i.streamed_reads for i in infos) > 0
    assert all(i.resident_bytes <= total // 4 for i in infos)


def test_a_shard_read_over_several_batches_is_fetched_once_a_pass(published, moto_server) -> None:
    """Batches of 100 elements span four shards of 32 and cut one at each end: a shard stays
    in the window between the requests of two batches until a pass read it to its end,
    while the shards after it are fetched ahead. At most one shard a pass is fetched twice:
    a read that finds all four slots begun drops the oldest (under load, several batches in
    flight); dropping the least recently used idle slot fetched two or more again."""
    store, total = published
    with reader(store, total // 2) as (_, cc):
        epoch(cc, 0, workers=1)  # the resident subset is in place
        streamed = cc.info(NAME).num_shards - cc.info(NAME).resident_shards
        for e in (1, 2):
            before = len(moto_server.access_log())
            ds = cc.dataset(NAME, shuffle="shards", seed=7, epoch=e)
            got = [int(i) for _, ids in ds.batch(100) for i in ids]
            assert sorted(got) == list(range(N)), f"epoch {e}: not every element exactly once"
            keys = [
                r.key
                for r in moto_server.access_log()[before:]
                if r.method == "GET" and r.key.startswith(f"tier/{NAME}/")
            ]
            again = sorted(k for k in set(keys) if keys.count(k) > 1)
            assert len(again) <= 1, f"epoch {e}: fetched more than once in one pass: {again}"
            assert len(keys) <= streamed + 1, (len(keys), streamed)


def read_bytes(port: int) -> float:
    """Record bytes the daemon sent readers so far, over gRPC and its data plane."""
    got = scrape(f"http://127.0.0.1:{port}/metrics")
    return sum(got[("shardcache_read_bytes_total", (("plane", p),))] for p in ("grpc", "data"))


def test_a_same_host_pass_reads_its_streamed_shards_from_the_window_files(published) -> None:
    """A direct pass over a cache twice the room reads element for element what a pass
    through the daemon reads, its streamed shards from the window's slot files under holds:
    the daemon sends no record of the pass, and counts each streamed shard read direct."""
    store, total = published
    port = free_port()
    with reader(store, total // 2, "--metrics-listen", f"127.0.0.1:{port}") as (_, cc):
        epoch(cc, 0, workers=1)  # the resident subset in place: the others are streamed
        through = [labels(cc.dataset(NAME, shuffle="shards", seed=7, epoch=e)) for e in (1, 2)]
        before, sent = cc.info(NAME), read_bytes(port)
        direct = [
            labels(cc.dataset(NAME, shuffle="shards", seed=7, epoch=e, direct=True)) for e in (1, 2)
        ]
        after = cc.info(NAME)
        assert direct == through
        assert read_bytes(port) == sent, "the daemon sent records to a same-host reader"
        streamed = after.num_shards - after.resident_shards
        held = after.streamed_direct_reads - before.streamed_direct_reads
        assert held >= 2 * streamed  # each streamed shard of both passes, once or more
        assert after.streamed_reads - before.streamed_reads == held  # a hold is a streamed read
        assert (after.window_reads, after.direct_leases) == (0, 0)
        got = scrape(f"http://127.0.0.1:{port}/metrics")
        assert got[("shardcache_cache_streamed_direct_reads_total", (("cache", NAME),))] == (
            after.streamed_direct_reads
        )


def test_a_pass_reads_its_streamed_shards_through_a_daemon_without_window_holds(
    published, caplog
) -> None:
    """A daemon that does not know HoldStreamedShard (an older one; its UNIMPLEMENTED made
    here on the client's channel) has the pass read its streamed shards through it, exactly,
    said once; with direct=False nothing is held either."""
    import grpc

    store, total = published
    port = free_port()
    with reader(store, total // 2, "--metrics-listen", f"127.0.0.1:{port}") as (_, cc):
        epoch(cc, 0, workers=1)
        expected = labels(cc.dataset(NAME, shuffle="shards", seed=7, epoch=1))

        class Unimplemented(grpc.RpcError):
            def code(self) -> grpc.StatusCode:
                return grpc.StatusCode.UNIMPLEMENTED

            def details(self) -> str:
                return "Method not found!"

        def unimplemented(request: Any, timeout: float | None = None) -> Any:
            raise Unimplemented()

        cc.info(NAME)  # connected: the transport and its stub exist
        cc._transport.stub.HoldStreamedShard = unimplemented  # type: ignore[union-attr]
        before, sent = cc.info(NAME).streamed_direct_reads, read_bytes(port)
        with caplog.at_level("INFO", logger="client"):
            ds = cc.dataset(NAME, shuffle="shards", seed=7, epoch=1, direct=True)
            passes = [labels(ds) for _ in range(2)]  # two passes of one dataset: said once
        assert passes[0] == expected and sorted(passes[1]) == list(range(N))
        said = [r for r in caplog.records if "does not serve its stream window" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]
        assert read_bytes(port) > sent  # the streamed shards came through the daemon
        assert labels(cc.dataset(NAME, shuffle="shards", seed=7, epoch=1, direct=False)) == (
            expected
        )
        assert cc.info(NAME).streamed_direct_reads == before


def _lease_and_streamed(ch: Any) -> tuple[Any, Any, list[int]]:
    """(a stub, a raw read lease of NAME, its streamed shards)."""
    from wire import stub

    s = stub(ch)
    lease = s.AcquireReadLease(pb.AcquireReadLeaseRequest(name=NAME), timeout=60)
    return s, lease, list(lease.streamed_shards)


def test_a_lease_holds_at_most_two_streamed_shards_and_unknown_releases_are_harmless(
    published,
) -> None:
    import grpc

    store, total = published
    with reader(store, total // 2) as (d, cc):
        epoch(cc, 0, workers=1)
        with grpc.insecure_channel(d.unix_target) as ch:
            s, lease, streamed = _lease_and_streamed(ch)
            assert len(streamed) >= 3
            hold = lambda shard: s.HoldStreamedShard(  # noqa: E731
                pb.HoldStreamedShardRequest(lease_id=lease.lease_id, shard=shard), timeout=60
            )
            release = lambda shard, lease_id=lease.lease_id: s.ReleaseStreamedShard(  # noqa: E731
                pb.ReleaseStreamedShardRequest(lease_id=lease_id, shard=shard), timeout=60
            )
            first, second = hold(streamed[0]), hold(streamed[1])
            for answer in (first, second):
                assert not answer.resident
                assert (
                    Path(answer.shard_dir).parent
                    == d.data_dir.resolve() / "caches" / NAME / "stream"
                )
                assert (Path(answer.shard_dir) / "data.mdb").is_file()
            assert hold(streamed[0]).shard_dir == first.shard_dir  # held once
            assert cc.info(NAME).window_reads == 2
            with pytest.raises(grpc.RpcError) as refused:
                hold(streamed[2])
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("shardcache-reason", "TOO_MANY_HOLDS") in refused.value.trailing_metadata()
            assert "at most 2 at once" in refused.value.details()
            assert "release one" in refused.value.details()
            release(streamed[0])
            assert not hold(streamed[2]).resident
            release(streamed[0])  # released already
            release(streamed[1], "0" * 32)  # no such lease
            resident = next(i for i in range(16) if i not in streamed)
            answer = hold(resident)
            assert answer.resident and answer.shard_dir == lease.shard_dirs[resident]
            with pytest.raises(grpc.RpcError) as out_of_range:
                hold(16)
            assert out_of_range.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as unknown:
                s.HoldStreamedShard(pb.HoldStreamedShardRequest(lease_id="0" * 32, shard=0))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            s.ReleaseReadLease(pb.ReleaseReadLeaseRequest(lease_id=lease.lease_id), timeout=60)
        assert cc.info(NAME).window_reads == 0  # the lease's end ended its holds


#: A process holding a streamed shard of NAME on a raw lease: prints the slot's directory,
#: then waits to be killed.
_HOLDER = textwrap.dedent(
    """
    import sys, threading, grpc
    from client.wire.v1 import cache_service_pb2 as pb
    from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

    target, name = sys.argv[1:3]
    s = pb_grpc.CacheServiceStub(grpc.insecure_channel(target))
    lease = s.AcquireReadLease(pb.AcquireReadLeaseRequest(name=name), timeout=60)
    shard = lease.streamed_shards[0]
    held = s.HoldStreamedShard(pb.HoldStreamedShardRequest(lease_id=lease.lease_id, shard=shard))
    print(held.shard_dir, flush=True)
    threading.Event().wait()
    """
)


def test_a_reader_killed_holding_a_streamed_shard_leaves_it_droppable(published) -> None:
    """A same-host reader SIGKILLed while it holds a window slot: its lease expires, the hold
    ends with it, and the window drops that slot as the next pass moves on (its disk freed)."""
    store, total = published
    port = free_port()
    args = ("--lease-ttl", "1", "--metrics-listen", f"127.0.0.1:{port}")
    with reader(store, total // 2, *args) as (d, cc):
        epoch(cc, 0, workers=1)
        env = {**env_without_tf_noise(), "PYTHONPATH": os.pathsep.join(sys.path)}
        with subprocess.Popen(
            [sys.executable, "-c", _HOLDER, d.unix_target, NAME],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        ) as holder:
            try:
                assert holder.stdout is not None
                slot = Path(holder.stdout.readline().strip())
                assert (slot / "data.mdb").is_file()
                assert cc.info(NAME).window_reads == 1
            finally:
                holder.send_signal(signal.SIGKILL)
        wait_until(
            lambda: (cc.info(NAME).window_reads, cc.info(NAME).direct_leases) == (0, 0),
            30,
            "the killed reader's lease and hold ended",
        )
        for e in (1, 2):  # the window moves on over every streamed shard
            assert sorted(epoch(cc, e, workers=1, direct=False)) == list(range(N))
        assert not slot.exists(), "the killed reader's slot was never dropped"
        info = cc.info(NAME)
        disk = scrape(f"http://127.0.0.1:{port}/metrics")[("shardcache_disk_bytes", ())]
        assert disk == info.resident_bytes + info.window_bytes


def test_holds_waiting_for_a_window_slot_are_bounded_daemon_wide_and_end_with_their_lease(
    published,
) -> None:
    """Every window slot held by two readers: later holds wait for a slot, at most
    MAX_HOLDING of them daemon-wide (one more is TOO_MANY_HOLDS at once, not queued); a
    waiting hold whose lease ends meanwhile is refused once a slot comes (NOT_FOUND), and
    keeps nothing held."""
    import grpc

    from cacheserver.catalog.leases import MAX_HOLDING

    store, total = published
    with reader(store, total // 2) as (d, cc):
        epoch(cc, 0, workers=1)
        with grpc.insecure_channel(d.unix_target) as ch:
            s, first, streamed = _lease_and_streamed(ch)
            _, second, _ = _lease_and_streamed(ch)
            assert len(streamed) > WINDOW_SLOTS

            def hold(lease: Any, shard: int) -> Any:
                request = pb.HoldStreamedShardRequest(lease_id=lease.lease_id, shard=shard)
                return s.HoldStreamedShard.future(request, timeout=120)

            def end(lease: Any) -> None:
                request = pb.ReleaseReadLeaseRequest(lease_id=lease.lease_id)
                s.ReleaseReadLease(request, timeout=60)

            for k in range(WINDOW_SLOTS):  # every slot in use, two a lease
                hold((first, second)[k // 2], streamed[k]).result()
            assert cc.info(NAME).window_reads == WINDOW_SLOTS
            others = streamed[WINDOW_SLOTS:]
            leases = [
                s.AcquireReadLease(pb.AcquireReadLeaseRequest(name=NAME), timeout=60)
                for _ in range(MAX_HOLDING + 1)
            ]
            calls = [hold(lease, others[k % len(others)]) for k, lease in enumerate(leases)]
            wait_until(lambda: any(c.done() for c in calls), 30, "a hold past the bound refused")
            refused = [c for c in calls if c.done()]
            assert len(refused) == 1, "more than one hold answered while no slot was free"
            with pytest.raises(grpc.RpcError) as too_many:
                refused[0].result()
            assert too_many.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("shardcache-reason", "TOO_MANY_HOLDS") in too_many.value.trailing_metadata()
            assert f"at most {MAX_HOLDING} at once" in too_many.value.details()
            for lease in leases:  # the waiting holds' leases end while they wait
                end(lease)
            end(second)  # two slots come free: each waiting hold fetches, then is refused
            for call in calls:
                if call is refused[0]:
                    continue
                with pytest.raises(grpc.RpcError) as ended:
                    call.result()
                assert ended.value.code() == grpc.StatusCode.NOT_FOUND
                assert "ended while shard" in ended.value.details()
            assert cc.info(NAME).window_reads == 2  # the first lease's two, nothing else kept
            end(first)
        assert cc.info(NAME).window_reads == 0
        assert sorted(epoch(cc, 1, workers=1)) == list(range(N))
