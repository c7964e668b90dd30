"""Direct writes (client/write/direct.py, cacheserver/catalog/direct_writes.py): real daemon, real
LMDB files written by the client, real faults (kill -9, a full tmpfs, a read-only mount,
flipped bytes)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon import Daemon
from waits import gone, wait_until
from wire import LAYOUT

tf = pytest.importorskip("tensorflow")

from client import (  # noqa: E402
    CacheClient,
    DataLossError,
    DirectWriteUnavailableError,
    ShardcacheError,
)
from client._transport import Transport, pb  # noqa: E402
from client.format.layout import Layout, Leaf  # noqa: E402
from client.format.values import Compressor  # noqa: E402
from client.write.direct import LocalWriter  # noqa: E402
from client.write.stream import CacheWriter  # noqa: E402

LAYOUT_64 = Layout((Leaf("uint8", (64,)),))
ADOPTED = "adopted"  # the daemon's log line for a commit of staged shards
MIB = 1 << 20


def labelled(n: int, size: int = 300) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(lambda i: (tf.fill([size], tf.cast(i, tf.float32)), i))


def labels(ds: tf.data.Dataset) -> list[int]:
    return [int(y) for _, y in ds.as_numpy_iterator()]


def random_records(n: int, size: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, np.uint8).tobytes() for _ in range(n)]


def local_writer(
    transport: Transport,
    name: str,
    size: int,
    shard_bytes: int = 0,
    mode: bool | str = True,
    local_data_dir: Path | None = None,
) -> LocalWriter:
    layout = Layout((Leaf("uint8", (size,)),))
    writer = LocalWriter(
        transport,
        pb.WriteBegin(
            name=name,
            fingerprint=f"fp-{name}",
            layout_json=layout.to_json(),
            shard_bytes=shard_bytes,
        ),
        mode,
        local_data_dir,
        chunk_bytes=4096,
    )  # a transaction per add()
    assert writer.begin().decision == pb.WRITE_DECISION_ACCEPTED
    return writer


@pytest.fixture
def read_only_view(daemon: Daemon) -> Iterator[Path]:
    """The daemon's data dir, bind-mounted read-only at another path (a sidecar's mount)."""
    mount = Path(tempfile.mkdtemp(prefix="sc-ro-", dir="/tmp"))
    if (
        subprocess.run(
            ["mount", "--bind", "-o", "ro", str(daemon.data_dir), str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        mount.rmdir()
        pytest.skip("cannot bind-mount read-only here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def test_a_same_host_write_through_commits_the_files_it_wrote_and_reads_back_equal(
    daemon, cc, name
) -> None:
    ds = cc.cache(labelled(1000), name=name)
    first = list(ds.as_numpy_iterator())
    assert [int(y) for _, y in first] == list(range(1000))
    assert f"cache {name!r}: checked and {ADOPTED} 1 shards" in daemon.log()
    again = list(ds.as_numpy_iterator())
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, again))
    assert len(again) == 1000 and cc.info(name).num_elements == 1000
    assert not (daemon.data_dir / "caches" / name / "local").exists(), "staging dir left"
    streamed = cc.cache(labelled(1000), name=f"{name}-grpc", direct=False)
    assert labels(streamed) == list(range(1000))
    assert f"cache '{name}-grpc': checked and {ADOPTED}" not in daemon.log()
    assert cc.info(name).stored_bytes == cc.info(f"{name}-grpc").stored_bytes


def test_a_local_write_of_several_shards_reads_back_record_for_record(daemon, cc, name) -> None:
    import grpc
    from wire import read_all

    values = [Compressor().pack(r) for r in random_records(40, 16 << 10, 1)]
    transport = Transport(daemon.unix_target)
    try:
        writer = local_writer(transport, name, 16 << 10, shard_bytes=100 << 10)
        assert writer.local
        for i in range(0, 40, 3):
            writer.add(values[i : i + 3], 3 * (16 << 10))
        cache = writer.finish()
    finally:
        transport.close()
    # a shard is closed once it holds shard_bytes: 9 records of 16 KiB reach 100 KiB
    assert [s.num_elements for s in cache.shards] == [9, 9, 9, 9, 4]
    assert [s.first_element for s in cache.shards] == [0, 9, 18, 27, 36]
    with grpc.insecure_channel(daemon.unix_target) as ch:
        assert read_all(ch, name) == values


def test_flipped_bytes_in_a_staged_file_are_refused_at_commit_as_data_loss(
    daemon, cc, name
) -> None:
    values = [Compressor().pack(r) for r in random_records(8, 16 << 10, 2)]
    staging = daemon.data_dir / "caches" / name / "local"
    transport = Transport(daemon.unix_target)
    try:
        writer = local_writer(transport, name, 16 << 10, shard_bytes=64 << 10)
        writer.add(values[:4], 4 * (16 << 10))
        writer.add(values[4:], 4 * (16 << 10))  # shard 0 is closed (fsynced) before this
        data = staging / "shard-00000" / "data.mdb"
        raw = bytearray(data.read_bytes())
        at = raw.find(values[2][1000:1100]) + 50  # inside record 2's stored bytes
        assert at > 50
        raw[at] ^= 0xFF
        data.write_bytes(bytes(raw))
        with pytest.raises(DataLossError, match="staged shard 0: record 2 is corrupt"):
            writer.finish()
    finally:
        transport.close()
    assert gone(cc, name)
    assert not (daemon.data_dir / "caches" / name).exists(), "the refused write left files"


def test_a_staged_shard_with_fewer_records_than_claimed_is_refused(daemon, cc, name) -> None:
    values = [Compressor().pack(r) for r in random_records(4, 4096, 3)]
    transport = Transport(daemon.unix_target)
    try:
        writer = local_writer(transport, name, 4096)
        writer.add(values, 4 * 4096)
        writer._close_shard()  # what finish() does first; then the claim is made to lie
        writer._staged[0].num_records, writer._staged[0].num_elements = 5, 5
        writer.num_elements = 5
        with pytest.raises(DataLossError, match="holds 4 values, the writer says 5"):
            writer.finish()
    finally:
        transport.close()
    assert gone(cc, name)


SLOW_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import tensorflow as tf
    from client import CacheClient
    target, name = sys.argv[1], sys.argv[2]
    def gen():
        for i in range(100_000):
            time.sleep(0.001)
            yield np.random.default_rng(i).random(4096, np.float32)  # hardly compressible
    src = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((4096,), tf.float32))
    with CacheClient(target) as cc:
        for i, x in enumerate(cc.cache(src, name=name, version="slow", direct=True)):
            if i == 300:
                print("STARTED", flush=True)
""")


def test_a_client_killed_mid_local_write_leaves_no_staging_dir_and_no_cache(
    daemon, cc, name
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, daemon.unix_target, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staged = daemon.data_dir / "caches" / name / "local" / "shard-00000" / "data.mdb"
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "STARTED", proc.stderr
        wait_until(lambda: staged.exists() and staged.stat().st_size > MIB)
        assert cc.info(name).state == "WRITING"
    finally:
        proc.kill()  # SIGKILL: no abort, no goodbye; the stream breaks
        proc.communicate()
    wait_until(lambda: gone(cc, name))
    wait_until(lambda: not (daemon.data_dir / "caches" / name).exists())
    wait_until(
        lambda: not any(p.name.startswith(name) for p in (daemon.data_dir / "trash").iterdir())
    )


def test_a_daemon_restarted_mid_local_write_removes_the_staged_files(fresh_daemon) -> None:
    values = [Compressor().pack(r) for r in random_records(4, 4096, 4)]
    transport = Transport(fresh_daemon.unix_target)
    try:
        writer = local_writer(transport, "restarted", 4096)
        writer.add(values, 4 * 4096)
        staging = fresh_daemon.data_dir / "caches" / "restarted" / "local"
        assert (staging / "shard-00000" / "data.mdb").exists()
        fresh_daemon.restart()  # kill -9, then start on the same data dir
        assert not staging.exists()
        assert "discarded 1 interrupted writes" in fresh_daemon.log()
        with pytest.raises(ShardcacheError, match=r"closed the write stream|UNAVAILABLE|reach"):
            writer.add(values, 4 * 4096)
        writer.abort()
    finally:
        transport.close()


def test_a_read_only_data_dir_falls_back_to_streaming_under_auto(
    daemon, read_only_view, name, caplog
) -> None:
    with (
        CacheClient(daemon.unix_target, local_data_dir=read_only_view) as cc,
        caplog.at_level(logging.INFO, logger="client"),
    ):
        assert labels(cc.cache(labelled(200), name=name)) == list(range(200))
        assert cc.info(name).num_elements == 200
    assert f"writing cache {name!r} over gRPC, not directly" in caplog.text
    assert "Read-only file system" in caplog.text
    assert f"cache {name!r}: checked and {ADOPTED}" not in daemon.log()
    assert not (daemon.data_dir / "caches" / name / "local").exists()


def test_a_read_only_data_dir_raises_a_clear_error_under_direct_true(
    daemon, read_only_view, name
) -> None:
    transport = Transport(daemon.unix_target)
    try:
        with pytest.raises(
            DirectWriteUnavailableError,
            match=r"cannot write under .*Read-only file system.*direct='auto'",
        ):
            local_writer(transport, name, 4096, local_data_dir=read_only_view)
    finally:
        transport.close()
    with CacheClient(daemon.unix_target, local_data_dir=read_only_view) as cc:
        with pytest.raises(
            tf.errors.UnknownError, match=r"DirectWriteUnavailableError: direct=True, .*Read-only"
        ):
            labels(cc.cache(labelled(10), name=name, direct=True))
        wait_until(lambda: gone(cc, name))
    assert not (daemon.data_dir / "caches" / name).exists()


def test_a_full_disk_during_a_local_write_warns_keeps_training_and_leaves_nothing(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = Daemon(data_dir=small_disk / "data").start()
    try:
        with CacheClient(daemon.unix_target) as cc:
            assert len(list(cc.cache(tf.data.Dataset.range(100), name="small"))) == 100
            free_before = shutil.disk_usage(small_disk).free
            rng = np.random.default_rng(0)
            big = tf.data.Dataset.from_tensor_slices(
                rng.integers(0, 256, size=(400, 128 << 10), dtype=np.uint8)
            )  # 50 MiB
            with caplog.at_level(logging.WARNING, logger="client"):
                seen = sum(1 for _ in cc.cache(big, name="big", direct=True))
            assert seen == 400, "the epoch must go on from the source pipeline"
            assert "disk full" in caplog.text, caplog.text
            assert [c.name for c in cc.list()] == ["small"]
            assert shutil.disk_usage(small_disk).free >= free_before - MIB, "space not released"
            assert not (small_disk / "data" / "caches" / "big").exists()
        log = daemon.log()
        assert "the writer of cache 'big' gave up: disk full" in log, log
        assert f"'big': checked and {ADOPTED}" not in log
    finally:
        daemon.close()


def test_a_local_write_over_the_capacity_limit_is_refused_at_commit_and_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = Daemon(extra_args=("--max-bytes", "3MiB")).start()
    try:
        with CacheClient(daemon.unix_target) as cc:
            rng = np.random.default_rng(1)
            big = tf.data.Dataset.from_tensor_slices(
                rng.integers(0, 256, size=(32, 128 << 10), dtype=np.uint8)
            )  # 4 MiB
            with caplog.at_level(logging.WARNING, logger="client"):
                assert sum(1 for _ in cc.cache(big, name="big", direct=True)) == 32
            assert "no room for cache 'big'" in caplog.text, caplog.text
            assert "--max-bytes is 3,145,728 bytes" in caplog.text
            assert gone(cc, "big")
            assert not (daemon.data_dir / "caches" / "big").exists()
            small = tf.data.Dataset.from_tensor_slices(
                rng.integers(0, 256, size=(8, 128 << 10), dtype=np.uint8)
            )  # 1 MiB: fits
            assert sum(1 for _ in cc.cache(small, name="small", direct=True)) == 8
            assert cc.info("small").num_elements == 8
        assert f"'small': checked and {ADOPTED}" in daemon.log()
    finally:
        daemon.close()


def test_a_writer_that_cancels_right_after_write_begun_leaves_no_writing_cache(
    daemon, cc, name
) -> None:
    """A stream cancelled while the daemon's handler waits at its first yield (before any
    chunk) must still discard the cache: the handler is never resumed, so only an RPC
    callback can tell it (found with direct=True refusing a read-only data dir)."""
    import grpc
    from wire import stub

    def requests(first: pb.WriteCacheRequest, stop: threading.Event) -> Iterator[Any]:
        yield first
        stop.wait(60)  # nothing more: the daemon's handler waits at its first yield

    names = [f"{name}-{i}" for i in range(6)]
    stop = threading.Event()
    with grpc.insecure_channel(daemon.unix_target) as ch:
        try:
            for n in names:
                begin = pb.WriteCacheRequest(
                    begin=pb.WriteBegin(name=n, fingerprint="f", layout_json=LAYOUT)
                )
                call = stub(ch).WriteCache(requests(begin, stop))
                assert next(call).begun.decision == pb.WRITE_DECISION_ACCEPTED
                call.cancel()
        finally:
            stop.set()
    wait_until(lambda: all(gone(cc, n) for n in names), 10)


def test_a_staging_dir_owned_by_another_user_is_not_written_into(daemon, cc, name) -> None:
    """Files this process created there could not be deleted by a daemon running as
    another user: the writer must stream instead (the daemon's uid is faked with chown)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    transport = Transport(daemon.unix_target)
    try:
        writer = LocalWriter(
            transport,
            pb.WriteBegin(name=name, fingerprint="f", layout_json=LAYOUT_64.to_json()),
            True,
            None,
        )
        begun = CacheWriter.begin(writer)  # the lease and the staging dir, no local write yet
        staging = daemon.data_dir / begun.local_dir
        os.chown(staging, 65534, -1)
        why = writer._open(begun)
        created = list(staging.iterdir())
        writer.abort()
    finally:
        transport.close()
    assert why == (
        "the daemon runs as uid 65534 and this process as uid 0: files written "
        "here could not be deleted by the daemon"
    )
    assert created == [] and not writer.local
    wait_until(lambda: gone(cc, name))
