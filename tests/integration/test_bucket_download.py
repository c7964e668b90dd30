"""Bucket.download against a real S3 server (moto): durable, the network thread receives
while the sink writes, hashes and syncs on threads of its own; not durable (a stream
window's scratch), the receiving thread writes and hashes (cacheserver/tier/bucket.py).

Either way, an object of many blocks and several sync intervals comes back byte for byte; a
corrupt one and a full disk are refused with what to do, and each leaves neither the file
nor its ``.part`` behind, nor a thread running.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3 import Store

from cacheserver.tier import bucket as tier_bucket
from cacheserver.tier.bucket import Bucket, StoredObject
from client.wire.status import DataLoss, DiskFull

#: More blocks than the sink holds, more bytes than one sync interval.
SIZE = 5 * tier_bucket._READ_BYTES + 12345
assert SIZE > tier_bucket._HELD_BLOCKS * tier_bucket._READ_BYTES
assert SIZE > tier_bucket._SYNC_BYTES


@pytest.fixture
def bucket(store: Store, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    return Bucket(store.url, store.endpoint)


@pytest.fixture
def stored(bucket: Bucket, tmp_path: Path) -> Iterator[tuple[StoredObject, bytes]]:
    data = os.urandom(SIZE)
    src = tmp_path / "src"
    src.write_bytes(data)
    yield bucket.upload(src, "objects/big"), data


@pytest.fixture(params=[True, False], ids=["durable", "scratch"])
def durable(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def left_behind(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_an_object_of_many_blocks_comes_back_whole_and_checked(
    bucket, stored, durable, tmp_path: Path, no_thread_leak
) -> None:
    obj, data = stored
    assert obj.sha256 == hashlib.sha256(data).hexdigest()
    out = tmp_path / "out"
    out.mkdir()
    seen: list[int] = []
    bucket.download(obj, out / "data.mdb", seen.append, durable=durable)
    assert (out / "data.mdb").read_bytes() == data
    assert sum(seen) == SIZE and left_behind(out) == ["data.mdb"]


def test_an_object_that_differs_from_its_manifest_is_data_loss_and_nothing_is_kept(
    bucket, stored, durable, tmp_path: Path, no_thread_leak
) -> None:
    obj, _ = stored
    wrong = StoredObject(obj.key, obj.size, hashlib.sha256(b"another").hexdigest())
    with pytest.raises(DataLoss, match=r"is corrupt: .*not served. Remove the cache"):
        bucket.download(wrong, tmp_path / "data.mdb", durable=durable)
    assert not (tmp_path / "data.mdb").exists()
    assert not (tmp_path / ".data.mdb.part").exists()


def test_a_full_disk_stops_the_download_with_disk_full_and_nothing_is_kept(
    bucket, stored, durable, small_disk: Path, no_thread_leak
) -> None:
    obj, _ = stored  # larger than the 24 MiB disk
    with pytest.raises(DiskFull, match="disk full under"):
        bucket.download(obj, small_disk / "data.mdb", durable=durable)
    assert left_behind(small_disk) == []
