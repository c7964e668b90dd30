"""Same-host direct reads against a real daemon: equality with gRPC, leases, faults."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

tf = pytest.importorskip("tensorflow")

from daemon import Daemon  # noqa: E402
from sharded import ids, write_sharded  # noqa: E402
from waits import wait_until  # noqa: E402
from wire import reason, records, write_cache  # noqa: E402

from client import (  # noqa: E402
    CacheClient,
    DirectReadUnavailableError,
    InvalidArgumentError,
)
from client._transport import pb  # noqa: E402

N = 600


def source(n: int = N, offset: int = 0) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(
        lambda i: {"x": tf.fill([8], tf.cast(i + offset, tf.float32)), "i": i + offset}
    )


@pytest.fixture(scope="module")
def sharded(daemon: Daemon) -> str:
    with CacheClient(daemon.unix_target) as cc:
        cache = write_sharded(cc, source(), "direct-sharded", shard_bytes=1000, chunk_bytes=1000)
    assert len(cache.shards) > 5
    return cache.name


def test_a_lease_of_shards_the_cache_lacks_is_refused_and_leaves_no_lease(cc, sharded) -> None:
    cache = cc._get(sharded)
    request = pb.AcquireReadLeaseRequest(
        name=sharded, fingerprint=cache.fingerprint, shards=[0, len(cache.shards)]
    )
    with pytest.raises(grpc.RpcError) as caught:
        cc._transport.stub.AcquireReadLease(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"has {len(cache.shards)} shards" in caught.value.details()
    assert cc.info(sharded).direct_leases == 0


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
@pytest.mark.parametrize("num_workers,parallel", [(1, 1), (1, 3), (3, 2)])
def test_direct_reads_yield_element_for_element_what_grpc_yields(
    cc, sharded, shuffle, num_workers, parallel
) -> None:
    def epochs(direct: bool) -> list[list[int]]:
        datasets = [
            cc.dataset(
                sharded,
                shuffle=shuffle,
                seed=5,
                worker_index=w,
                num_workers=num_workers,
                parallel_shards=parallel,
                direct=direct,
            )
            for w in range(num_workers)
        ]
        return [[i for ds in datasets for i in ids(ds)] for _epoch in range(2)]

    before = cc.info(sharded).direct_reads
    over_grpc = epochs(False)
    assert cc.info(sharded).direct_reads == before, "direct=False took a lease"
    direct = epochs(True)
    assert cc.info(sharded).direct_reads == before + 2 * num_workers  # one lease per pass
    assert direct == over_grpc
    assert sorted(direct[0]) == list(range(N))
    assert cc.info(sharded).direct_leases == 0, "a finished pass left its lease behind"


def test_resuming_mid_epoch_directly_yields_the_same_rest_as_over_grpc(cc, sharded) -> None:
    state = cc.read_state(sharded, elements_seen=N + 123, shuffle=True, seed=3)
    rests = [
        ids(cc.dataset(sharded, shuffle=True, seed=3, resume=state, direct=d).take(400))
        for d in (False, True)
    ]
    assert rests[0] == rests[1] and len(rests[0]) == 400


def test_a_pass_counts_one_hit_whether_direct_or_not(cc, sharded) -> None:
    hits = cc.info(sharded).hits
    ids(cc.dataset(sharded, direct=True))
    ids(cc.dataset(sharded, direct=False))
    assert cc.info(sharded).hits == hits + 2


def test_cc_cache_reads_its_later_epochs_directly(cc, name) -> None:
    ds = cc.cache(source(200), name, direct=True)
    assert ids(ds) == list(range(200))  # writes the cache
    assert cc.info(name).direct_reads == 0
    assert ids(ds) == list(range(200))
    assert cc.info(name).direct_reads == 1


def test_bad_direct_values_are_refused_before_reading(cc, sharded, monkeypatch) -> None:
    with pytest.raises(InvalidArgumentError, match="direct must be 'auto', True or False"):
        cc.dataset(sharded, direct="yes please")
    monkeypatch.setenv("SHARDCACHE_DIRECT", "sometimes")
    with pytest.raises(InvalidArgumentError, match="SHARDCACHE_DIRECT"):
        cc.dataset(sharded)


def test_the_environment_turns_direct_reads_off(cc, sharded, monkeypatch) -> None:
    monkeypatch.setenv("SHARDCACHE_DIRECT", "false")
    before = cc.info(sharded).direct_reads
    assert ids(cc.dataset(sharded)) == list(range(N))
    assert cc.info(sharded).direct_reads == before


def test_a_cache_deleted_and_rebuilt_mid_read_keeps_serving_the_leased_files(daemon, name) -> None:
    with CacheClient(daemon.unix_target) as cc:
        write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
        it = cc.dataset(name, direct=True, prefetch_bytes=1).as_numpy_iterator()
        got = [int(next(it)["i"]) for _ in range(10)]
        assert cc.info(name).direct_leases == 1
        cc.delete(name)
        write_sharded(cc, source(offset=10_000), name, shard_bytes=1000, chunk_bytes=1000)
        got += [int(e["i"]) for e in it]
        assert got == list(range(N)), "the pass mixed in the rebuilt cache's elements"
        assert ids(cc.dataset(name, direct=True)) == list(range(10_000, 10_000 + N))


def test_a_truncated_shard_file_raises_data_loss_instead_of_crashing(daemon, name) -> None:
    with CacheClient(daemon.unix_target) as cc:
        write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
        data = daemon.data_dir / "caches" / name / "shard-00002" / "data.mdb"
        os.truncate(data, data.stat().st_size // 2)
        with pytest.raises(tf.errors.OpError, match=r"DataLossError: .*\(truncated\)"):
            ids(cc.dataset(name, direct=True))
        assert cc.info(name).direct_leases == 0, "the failed pass kept its lease"


def test_corrupt_record_bytes_raise_data_loss_naming_the_record(daemon, name) -> None:
    with CacheClient(daemon.unix_target) as cc:
        write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
        good = ids(cc.dataset(name, direct=True))
        data = daemon.data_dir / "caches" / name / "shard-00001" / "data.mdb"
        blob = bytearray(data.read_bytes())
        at = blob.find(b"\x28\xb5\x2f\xfd")  # a zstd frame: one stored record
        assert at > 0
        blob[at + 12 : at + 20] = bytes(8)
        data.write_bytes(bytes(blob))
        with pytest.raises(tf.errors.OpError, match=r"DataLossError: .* is corrupt"):
            ids(cc.dataset(name, direct=True))
        assert good == list(range(N))


def test_a_daemon_killed_mid_epoch_lets_the_direct_pass_finish_from_local_files(
    caplog, name
) -> None:
    d = Daemon(extra_args=("--lease-ttl", "0.3")).start()
    try:
        with CacheClient(d.unix_target) as cc:
            write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
            it = cc.dataset(name, direct=True, prefetch_bytes=1).as_numpy_iterator()
            got = [int(next(it)["i"]) for _ in range(5)]
            d.kill()
            with caplog.at_level(logging.WARNING, logger="client"):
                wait_until(lambda: "cannot renew it" in caplog.text, 30, "the renew failure")
                got += [int(e["i"]) for e in it]
        assert got == list(range(N))
        assert "this pass finishes from the shard files it holds open" in caplog.text
    finally:
        d.close()


_HOLDER = """
import sys
from client import CacheClient
from client.read.fetching.direct import DirectReads
cc = CacheClient(sys.argv[1])
fetcher, _ = DirectReads(cc._transport, True, None).fetcher(cc._get(sys.argv[2]))
print("leased", flush=True)
sys.stdin.read()
"""


def test_a_killed_readers_lease_expires_and_its_cache_becomes_evictable() -> None:
    d = Daemon(extra_args=("--max-bytes", "3.6MiB", "--lease-ttl", "1")).start()
    holder = None
    try:
        with CacheClient(d.unix_target) as cc, grpc.insecure_channel(d.unix_target) as ch:
            for i, n in enumerate("abc"):  # three 1 MiB caches: a fourth does not fit
                write_cache(ch, n, records(8, 128 << 10, i))
            cc.pin("b")
            cc.pin("c")
            holder = subprocess.Popen(
                [sys.executable, "-c", _HOLDER, d.unix_target, "a"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"leased\n"
            assert cc.info("a").direct_leases == 1
            with pytest.raises(grpc.RpcError) as err:
                write_cache(ch, "d", records(8, 128 << 10, 9))
            assert reason(err.value) == "CAPACITY_EXCEEDED"
            assert "1 being read" in err.value.details(), "the leased cache was evictable"
            holder.kill()  # SIGKILL: no release, no more renewals
            holder.communicate(timeout=30)
            wait_until(lambda: cc.info("a").direct_leases == 0, 30, "the lease's expiry")
            write_cache(ch, "d", records(8, 128 << 10, 9))
            assert sorted(c.name for c in cc.list()) == ["b", "c", "d"]
            assert "read lease on cache 'a' expired" in d.log()
    finally:
        if holder is not None:
            holder.kill()
            holder.communicate(timeout=30)  # also closes its pipes
        d.close()


class _OtherNamespaceDaemon(Daemon):
    """The daemon in its own mount namespace with a private tmpfs over its data dir: the
    test process sees an empty directory at the daemon's data dir path, as a client on
    another host (or in a container without the volume) would."""

    @property
    def command(self) -> list[str]:
        return [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs tmpfs "$0" && exec "$@"',
            str(self.data_dir),
            *super().command,
        ]


@pytest.fixture
def elsewhere() -> Iterator[Daemon]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    d = _OtherNamespaceDaemon()
    d.data_dir.mkdir(parents=True)
    d.start()
    yield d
    d.close()


def test_a_daemon_whose_files_are_not_visible_here_is_read_over_grpc_or_refused(
    elsewhere, caplog, name
) -> None:
    with CacheClient(elsewhere.unix_target) as cc:
        write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
        assert not (elsewhere.data_dir / "caches").exists(), "the namespaces are not apart"
        with caplog.at_level(logging.INFO, logger="client"):
            assert ids(cc.dataset(name)) == list(range(N))
        assert "reading over gRPC, not directly" in caplog.text
        assert "instance.token does not exist" in caplog.text
        with pytest.raises(DirectReadUnavailableError, match="is not visible here") as err:
            ids(cc.dataset(name, direct=True))
        assert "local_data_dir=" in str(err.value)
        info = cc.info(name)
        assert (info.direct_leases, info.direct_reads, info.hits) == (0, 0, 1)  # refused: no pass


def test_a_data_dir_mounted_elsewhere_is_read_through_local_data_dir(daemon, name) -> None:
    mount = Path(tempfile.mkdtemp(prefix="sc-ro-", dir="/tmp"))
    mounted = (
        subprocess.run(
            ["mount", "--bind", "-o", "ro", str(daemon.data_dir), str(mount)], capture_output=True
        ).returncode
        == 0
    )
    if not mounted:  # not root: a symlink is another path to the same files too
        mount.rmdir()
        mount.symlink_to(daemon.data_dir)
    try:
        with CacheClient(daemon.unix_target, local_data_dir=mount) as cc:
            write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
            assert ids(cc.dataset(name, direct=True, shuffle=True, seed=1)) == ids(
                cc.dataset(name, direct=False, shuffle=True, seed=1)
            )
            assert cc.info(name).direct_reads == 1
        with (
            CacheClient(daemon.unix_target, local_data_dir=mount / "caches") as cc,
            pytest.raises(DirectReadUnavailableError, match="local_data_dir"),
        ):
            ids(cc.dataset(name, direct=True))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False)
            mount.rmdir()
        else:
            mount.unlink()


def test_a_finished_pass_leaves_no_shard_file_open_in_the_client(daemon, name) -> None:
    with CacheClient(daemon.unix_target) as cc:
        write_sharded(cc, source(), name, shard_bytes=1000, chunk_bytes=1000)
        shards = daemon.data_dir / "caches" / name

        def open_shard_files() -> list[str]:
            fds = Path("/proc/self/fd")
            return [
                t
                for t in (os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).exists())
                if t.startswith(str(shards))
            ]

        def mapped() -> list[str]:
            return [
                line
                for line in Path("/proc/self/maps").read_text().splitlines()
                if str(shards) in line
            ]

        it = cc.dataset(name, direct=True, prefetch_bytes=1).as_numpy_iterator()
        next(it)
        assert mapped(), "the pass does not map the shard files"
        for _ in it:
            pass

        def released() -> bool:
            # the pass's lease ends when TensorFlow drops the tensor holding it: after the
            # last element, on its own threads, or at the next call into TensorFlow (which
            # defers the release of numpy-backed tensors freed without the GIL)
            tf.constant(0)
            return open_shard_files() == [] and mapped() == []

        wait_until(
            released,
            10,
            "a finished pass's shard files closed and unmapped (else a "
            "deleted cache's space would stay allocated)",
        )
