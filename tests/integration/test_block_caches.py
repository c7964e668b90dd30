"""Blocks (format 2) through a real daemon: layout on disk, exact reads, corruption."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import grpc
import lmdb
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from wire import stub  # noqa: E402

from client import CacheClient  # noqa: E402
from client._transport import pb  # noqa: E402
from client.errors import InvalidArgumentError  # noqa: E402

N = 3000
BASE = tf.linspace(0.0, 1.0, 256).numpy()


def source(n: int = N) -> tf.data.Dataset:
    """~1 KB elements as in bench's `small`: 256 float32 features + an int64 label."""
    return tf.data.Dataset.range(n).map(
        lambda i: (tf.cast(i, tf.float32) + tf.linspace(0.0, 1.0, 256), i)
    )


def labels_and_check(ds: tf.data.Dataset) -> list[int]:
    out = []
    for x, i in ds.as_numpy_iterator():
        np.testing.assert_array_equal(x, np.float32(i) + BASE)
        out.append(int(i))
    return out


def values_in(shard: Path) -> int:
    with lmdb.open(str(shard), readonly=True, lock=False) as env:
        return int(env.stat()["entries"])


def test_small_elements_are_written_in_blocks_and_every_read_returns_them_exactly(
    daemon, cc: CacheClient, name: str
) -> None:
    assert labels_and_check(cc.cache(source(), name=name)) == list(range(N))
    cache = cc._get(name)
    layout = json.loads(cache.layout_json)
    assert (layout["format"], layout["block_elements"], layout["block_shuffle"]) == (4, 254, 4)
    shard = daemon.data_dir / "caches" / name / "shard-00000"
    assert values_in(shard) == -(-N // 254)  # 12 values, not 3000
    assert labels_and_check(cc.dataset(name)) == list(range(N))
    shares = [
        labels_and_check(cc.dataset(name, worker_index=w, num_workers=7)) for w in range(7)
    ]  # shares start and end inside blocks
    assert [i for share in shares for i in share] == list(range(N))
    assert labels_and_check(cc.dataset(name, start=1000)) == list(range(1000, N))
    got = labels_and_check(cc.dataset(name, shuffle=True, seed=3))
    assert sorted(got) == list(range(N)) and got != list(range(N))
    assert sorted(labels_and_check(cc.dataset(name, shuffle="shards", seed=3))) == list(range(N))
    fast = cc.dataset(name, shuffle=True, seed=3, parallel_shards=3)
    assert labels_and_check(fast) == labels_and_check(cc.dataset(name, shuffle=True, seed=3))


def test_block_bytes_zero_stores_one_element_per_value_and_reads_the_same(
    daemon, cc: CacheClient, name: str
) -> None:
    assert labels_and_check(cc.cache(source(), name=name, block_bytes=0)) == list(range(N))
    assert json.loads(cc._get(name).layout_json)["format"] == 1
    assert values_in(daemon.data_dir / "caches" / name / "shard-00000") == N
    got = labels_and_check(cc.dataset(name, shuffle=True, seed=3))
    assert sorted(got) == list(range(N)) and got != list(range(N))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64k"])
def test_a_bad_block_bytes_is_refused_before_anything_runs(
    cc: CacheClient, name: str, bad: object
) -> None:
    with pytest.raises(InvalidArgumentError, match="block_bytes must be an int >= 0"):
        cc.cache(source(), name=name, block_bytes=bad)  # type: ignore[arg-type]


def _flip_byte_in_block(shard: Path, block: int) -> None:
    """Flip a byte in the middle of the stored value of block (a zstd frame)."""
    with lmdb.open(str(shard), readonly=True, lock=False) as env, env.begin() as txn:
        value = bytes(txn.get(struct.pack(">Q", block)))
    assert value[0] == 0x01, "expected a zstd frame"
    path = shard / "data.mdb"
    blob = bytearray(path.read_bytes())
    at = blob.find(value)
    assert at >= 0
    blob[at + len(value) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_corrupt_block_is_reported_as_data_loss_naming_shard_and_block(
    daemon, cc: CacheClient, name: str, shuffle: bool
) -> None:
    tokens = tf.data.Dataset.range(N).map(
        lambda i: tf.cast(i + tf.range(512, dtype=tf.int64) % 5, tf.int32)
    )  # distinct blocks
    assert len(list(cc.cache(tokens, name=name))) == N
    k = json.loads(cc._get(name).layout_json)["block_elements"]
    _flip_byte_in_block(daemon.data_dir / "caches" / name / "shard-00000", 5)
    # ReadShard: the client finds it; ReadElements: the daemon, cutting elements out
    where = (
        rf"shard 0 block 5 \(elements {5 * k}-{6 * k - 1}"
        if not shuffle
        else r"shard 0 block 5 is corrupt"
    )
    with pytest.raises(tf.errors.OpError, match=rf"DataLossError: cache '{name}' {where}"):
        list(cc.dataset(name, shuffle=shuffle, seed=1))


def test_a_writer_whose_element_count_does_not_fit_its_blocks_is_refused(daemon, name) -> None:
    layout = json.dumps(
        {
            "format": 2,
            "block_elements": 4,
            "block_shuffle": 1,
            "leaves": [{"dtype": "uint8", "shape": [2]}],
        }
    )
    value = b"\x00" + struct.pack("<I", 0) + b""  # contents never looked at by the daemon

    def requests(claimed: int):
        yield pb.WriteCacheRequest(
            begin=pb.WriteBegin(name=name, fingerprint="fp", layout_json=layout)
        )
        yield pb.WriteCacheRequest(
            chunk=pb.WriteChunk(lengths=struct.pack("<3I", 5, 5, 5), data=value * 3, raw_bytes=24)
        )
        yield pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=claimed))

    with grpc.insecure_channel(daemon.unix_target) as channel:
        for claimed in (8, 13):  # 3 blocks of 4 hold 9 to 12 elements
            with pytest.raises(grpc.RpcError) as info:
                list(stub(channel).WriteCache(requests(claimed), timeout=30))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"writer says {claimed} elements, sent 12 in blocks of 4" in info.value.details()
        responses = list(stub(channel).WriteCache(requests(10), timeout=30))
        assert responses[-1].committed.num_elements == 10


def photo_like(n: int, side: int, seed: int = 0) -> np.ndarray:
    """n uint8 side x side x 3 images whose rows are alike but noisy, as a photo's are."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(-2, 3, size=(n, side, side * 3)).astype(np.uint8)
    steps[:, 0] = rng.integers(0, 256, size=(n, side * 3), dtype=np.uint8)
    return np.cumsum(steps, axis=1, dtype=np.uint8).reshape(n, side, side, 3)


@pytest.mark.parametrize("side", [24, 160])  # blocks of 88 elements; one element per value
def test_image_rows_are_stored_as_differences_and_every_read_returns_the_pixels(
    daemon, cc: CacheClient, name: str, side: int
) -> None:
    images = photo_like(300, side)
    src = tf.data.Dataset.from_tensor_slices((images, np.arange(300)))

    def exact(ds: tf.data.Dataset) -> list[int]:
        out = []
        for x, i in ds.as_numpy_iterator():
            np.testing.assert_array_equal(x, images[i])
            out.append(int(i))
        return out

    assert exact(cc.cache(src, name=name)) == list(range(300))
    cache = cc._get(name)
    layout = json.loads(cache.layout_json)
    assert (layout["format"], layout["row_delta"]) == (3, True)
    assert cache.raw_bytes / cache.stored_bytes > 1.8  # the pixels alone: ~1.0x
    for direct in (False, True):
        assert exact(cc.dataset(name, direct=direct)) == list(range(300))
        got = exact(cc.dataset(name, shuffle=True, seed=5, direct=direct))
        assert sorted(got) == list(range(300)) and got != list(range(300))
    shares = [exact(cc.dataset(name, worker_index=w, num_workers=4)) for w in range(4)]
    assert sorted(i for share in shares for i in share) == list(range(300))
