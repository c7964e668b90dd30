"""batch(B) on a cache's dataset reads the batches themselves: one copy from the shard files
(or the socket) into each batch's arrays, which TensorFlow takes as they are.

Every read option must give, batch for batch, what the element read batched by tf.data
gives: stored order, both shuffles, worker shares, a start mid-epoch, an elastic resume,
a partial last batch or drop_remainder, over shard boundaries and blocks cut by a batch's
ends, read directly, over gRPC and over the data plane.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from sharded import write_sharded  # noqa: E402

from client import CacheClient  # noqa: E402
from client.format.layout import Layout  # noqa: E402
from client.read.assembly import buffers  # noqa: E402
from client.tf.reads import GROUP_BYTES  # noqa: E402
from client.wire import plane  # noqa: E402

N = 500


def source(n: int, width: int) -> tf.data.Dataset:
    """Element i: x = i repeated width times (float32), and i."""
    return tf.data.Dataset.range(n).map(
        lambda i: {"x": tf.fill([width], tf.cast(i, tf.float32)), "i": i}
    )


#: layouts, as (width, block_bytes, shard_bytes): blocks of a few elements (cut by most
#: batches' ends), one small element per stored value (the vectorized decoder), one large
#: element per value (the aligned decoder); shards of about a fifth of the stored bytes
LAYOUTS = {"blocks": (32, 1024, 1000), "records": (32, None, 2500), "large": (4096, None, 2800)}


@pytest.fixture(scope="module")
def caches(daemon: Any) -> dict[str, str]:
    names = {}
    with CacheClient(daemon.unix_target) as cc:
        for layout, (width, block_bytes, shard_bytes) in LAYOUTS.items():
            name = names[layout] = f"batched-{layout}"
            write_sharded(
                cc,
                source(N, width),
                name,
                shard_bytes,
                chunk_bytes=1024,
                block_bytes=block_bytes,
                batch_elements=16,
            )
            assert len(cc._get(name).shards) >= 4  # batches cross shard boundaries
    return names


@pytest.fixture(scope="module")
def clients(daemon: Any) -> Iterator[dict[str, tuple[CacheClient, bool]]]:
    """direct: the shard files; grpc: a unix socket's client; plane: a TCP client's."""
    with CacheClient(daemon.unix_target) as unix, CacheClient(daemon.tcp_target) as tcp:
        yield {"direct": (unix, True), "grpc": (unix, False), "plane": (tcp, False)}


def checked(element: dict[str, np.ndarray]) -> list[int]:
    """The ids of a batch (or an element), each checked to carry its own record."""
    x, i = element["x"], np.atleast_1d(element["i"])
    assert (x == i.reshape(-1, 1).astype(np.float32)).all()
    return i.tolist()


def state(cc: CacheClient, name: str) -> list[Any]:
    """Two workers of a shuffled split, 40 and 70 elements into their epoch 1."""
    return [
        cc.read_state(
            name, elements_seen=N // 2 + seen, shuffle=True, seed=4, worker_index=w, num_workers=2
        )
        for w, seen in enumerate((40, 70))
    ]


READS: dict[str, dict[str, Any]] = {
    "stored": {},
    "shuffled": {"shuffle": True, "seed": 3, "epoch": 1},
    "shards": {"shuffle": "shards", "seed": 3},
    "share": {"worker_index": 1, "num_workers": 3},
    "start": {"start": 37},
    "elastic": {"shuffle": True, "seed": 4, "worker_index": 2, "num_workers": 3},
}


#: every read of the blocked cache; the two orders of the others
CASES = [("blocks", read) for read in READS] + [
    (layout, read) for layout in ("records", "large") for read in ("stored", "shuffled")
]


@pytest.mark.parametrize(("layout", "read"), CASES)
def test_batches_are_the_elements_batched_for_every_read(
    clients: dict[str, tuple[CacheClient, bool]], caches: dict[str, str], layout: str, read: str
) -> None:
    name = caches[layout]
    for path, (cc, direct) in clients.items():
        if path != "direct" and read not in ("stored", "shuffled"):
            continue  # the same chunks as the direct read; their fetchers are tested apart
        opts = dict(READS[read], direct=direct)
        if read == "elastic":
            opts["resume"] = state(cc, name)
        unbatched = cc.dataset(name, **opts)
        elements = [i for e in unbatched.as_numpy_iterator() for i in checked(e)]
        for size, drop in ((7, False), (64, True)):
            batched = cc.dataset(name, **opts).batch(size, drop_remainder=drop)
            width = LAYOUTS[layout][0]
            assert batched.element_spec["x"].shape.as_list() == [size if drop else None, width]
            batches = [checked(b) for b in batched.as_numpy_iterator()]
            want = [elements[k : k + size] for k in range(0, len(elements), size)]
            if drop and want and len(want[-1]) < size:
                want.pop()
            assert batches == want, (path, size, drop)
            known = int(unbatched.cardinality()) >= 0  # not when a start makes epochs differ
            assert int(batched.cardinality()) == (len(want) if known else -2)


def test_a_cc_cache_reads_its_batches_as_batches_from_its_second_epoch(
    cc: CacheClient, name: str
) -> None:
    ds = cc.cache(source(N, 32), name=name).batch(64, drop_remainder=True)
    want = [list(range(k, k + 64)) for k in range(0, N - 63, 64)]
    for _ in range(3):  # a write epoch, then reads
        assert [checked(b) for b in ds.as_numpy_iterator()] == want


def test_every_read_epoch_of_a_cc_cache_decodes_into_the_same_batch_maps(
    cc: CacheClient, name: str, buffer_pools: list[buffers.Buffers]
) -> None:
    """Each read epoch of cc.cache() checks the cache afresh, but keeps the maps earlier
    epochs decoded into: a fresh map's pages are zeroed (and, in a VM, backed by the host)
    as they are first written, which cost a warm epoch of images most of its time."""
    size = unbatched_size(4096 * 4 + 8)
    ds = cc.cache(source(N, 4096), name=name).batch(size)
    for _ in range(4):  # a write epoch, then reads
        assert sum(len(checked(b)) for b in ds.as_numpy_iterator()) == N
    reading = [pool for pool in buffer_pools if pool.made]
    assert len(reading) == 1, [pool.made for pool in buffer_pools]
    assert reading[0].made <= 8, f"{reading[0].made} maps for 3 epochs"


def unbatched_size(record: int) -> int:
    """The smallest batch of record-byte elements read one to a chunk, into arrays of its own
    (smaller ones are read several at a time and cut apart: client/tf/reads.py)."""
    return GROUP_BYTES // 2 // record + 1


def address(x: tf.Tensor) -> tf.Tensor:
    """Where x lies in memory, as TensorFlow holds it."""

    def where(x: np.ndarray) -> np.int64:
        return np.int64(x.ctypes.data)

    return tf.numpy_function(where, [x], tf.int64, stateful=False)


def addresses(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Where each batch's x lies in memory, as TensorFlow holds it after batch()."""
    return ds.map(lambda b: address(b["x"]))


def test_the_arrays_a_read_decodes_into_are_the_batches_tensorflow_hands_on(
    clients: dict[str, tuple[CacheClient, bool]],
    caches: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: set[int] = set()
    empty = buffers.Buffers.empty

    def recorded(self: buffers.Buffers, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        array = empty(self, shape, dtype)
        made.add(array.ctypes.data)
        return array

    monkeypatch.setattr(buffers.Buffers, "empty", recorded)
    size = unbatched_size(4096 * 4 + 8)  # smaller batches are cut from a chunk (reads.py)
    for path in ("direct", "plane"):
        cc, direct = clients[path]
        ds = cc.dataset(caches["large"], direct=direct, shuffle=True, seed=1).batch(size)
        seen = [int(a) for a in addresses(ds).as_numpy_iterator()]
        assert len(seen) == -(-N // size)
        assert all(a % 64 == 0 for a in seen)  # aligned: adopted by TensorFlow as it is
        assert set(seen) <= made, f"{path}: a batch was copied after it was decoded"
        made.clear()


def anonymous_maps(nbytes: int) -> int:
    """Anonymous maps of this process of exactly nbytes (a batch's arrays, buffers.py)."""
    count = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in re.split("-", fields[0]))
        if hi - lo == nbytes and len(fields) < 6:
            count += 1
    return count


def test_a_hundred_epochs_hold_no_more_batch_arrays_than_the_first(
    clients: dict[str, tuple[CacheClient, bool]], caches: dict[str, str]
) -> None:
    cc, _ = clients["direct"]
    size = unbatched_size(4096 * 4 + 8)
    nbytes = size * 4096 * 4  # a batch's x, in a map of its own (buffers.MIN_BYTES)
    ds = cc.dataset(caches["large"], direct=True).batch(size).repeat(100)
    held = []
    for k, _ in enumerate(ds):
        if k % (-(-N // size)) == 0:
            held.append(anonymous_maps(nbytes))
    assert len(held) == 100
    # a leak would add one or more each epoch; tf.data may hold a batch more now and then
    assert max(held[10:]) <= max(held[:10]) + 2, held


def noise(n: int, width: int) -> tf.data.Dataset:
    """Element i: x = width random float32 (seed i: incompressible, stored raw), and i."""
    return tf.data.Dataset.range(n).map(
        lambda i: {"x": tf.random.stateless_uniform([width], tf.stack([i, 0])), "i": i}
    )


#: records of 16 KiB and more, one per stored value, raw: what the data plane lands
NOISE = (300, 4100, 700_000)  # elements, width, shard bytes


@pytest.fixture(scope="module")
def noise_cache(daemon: Any) -> str:
    n, width, shard_bytes = NOISE
    with CacheClient(daemon.unix_target) as cc:
        write_sharded(cc, noise(n, width), "batched-noise", shard_bytes, 50_000, batch_elements=16)
        assert len(cc._get("batched-noise").shards) >= 3
    return "batched-noise"


def received(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The addresses of every buffer the data plane's sockets write into from now on."""
    into: set[int] = set()
    exact, parts = plane.recv_exact, plane.recv_parts

    def recv_exact(sock: Any, out: memoryview) -> None:
        into.add(np.frombuffer(out, np.uint8).ctypes.data)
        exact(sock, out)

    def recv_parts(sock: Any, buffers: list[memoryview]) -> None:
        into.update(np.frombuffer(b, np.uint8).ctypes.data for b in buffers)
        parts(sock, buffers)

    monkeypatch.setattr(plane, "recv_exact", recv_exact)
    monkeypatch.setattr(plane, "recv_parts", recv_parts)
    return into


def flip(cache_dir: Path, found: bytes, offset: int) -> None:
    """Flip a byte of the shard file that holds found, offset bytes after it."""
    for shard in sorted(cache_dir.glob("shard-*")):
        data = shard / "data.mdb"
        blob = bytearray(data.read_bytes())
        at = blob.find(found)
        if at >= 0:
            blob[at + offset] ^= 0xFF
            data.write_bytes(bytes(blob))
            return
    raise AssertionError(f"no shard of {cache_dir} holds those bytes")


def landed(
    clients: dict[str, tuple[CacheClient, bool]],
    name: str,
    size: int,
    monkeypatch: pytest.MonkeyPatch,
    opts: dict[str, Any],
    leaf: Any = lambda b: b,
) -> list[tuple[Any, Any]]:
    """(batch read over the data plane, the same batch read directly) of each batch(size) of
    name, the plane's batches checked to lie where its socket wrote (their leaf's rows)."""
    unix, _ = clients["direct"]
    tcp, _ = clients["plane"]
    want = [b for b in unix.dataset(name, direct=True, **opts).batch(size).as_numpy_iterator()]
    into = received(monkeypatch)
    ds = tcp.dataset(name, direct=False, **opts).batch(size)
    got = list(ds.map(lambda b: (address(leaf(b)), b)).as_numpy_iterator())
    monkeypatch.undo()
    assert len(got) == len(want) > 1
    seen = {int(at) for at, _ in got}
    assert seen <= into, f"{opts}: a batch is not where the socket wrote its rows"
    return [(a, b) for (_, a), b in zip(got, want)]


def test_the_data_plane_receives_raw_records_straight_into_the_batches_tensorflow_hands_on(
    clients: dict[str, tuple[CacheClient, bool]],
    noise_cache: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = unbatched_size(4100 * 4 + 8)
    for opts in ({}, {"shuffle": True, "seed": 2}):
        pairs = landed(clients, noise_cache, size, monkeypatch, opts, lambda b: b["x"])
        assert len(pairs) == -(-NOISE[0] // size)
        for a, b in pairs:
            assert (a["i"] == b["i"]).all()
            assert (a["x"] == b["x"]).all()


def test_a_corrupt_record_received_into_its_batch_raises_data_loss_naming_it(
    daemon: Any, clients: dict[str, tuple[CacheClient, bool]]
) -> None:
    n, width, shard_bytes = NOISE
    unix, _ = clients["direct"]
    tcp, _ = clients["plane"]
    name = "batched-noise-corrupt"
    write_sharded(unix, noise(n, width), name, shard_bytes, 50_000, batch_elements=16)
    x = next(iter(noise(n, width).skip(7)))["x"].numpy()
    flip(daemon.data_dir / "caches" / name, x[:8].tobytes(), 4096)
    with pytest.raises(tf.errors.OpError, match=r"DataLossError: .*\(element 7\) is corrupt"):
        for _ in tcp.dataset(name, direct=False).batch(16):
            pass


#: one leaf of 4 KiB random float32 (stored raw) in blocks of 4 (16 KiB): what the data
#: plane receives a block at a time into the batch's rows; shards of whole batches of 16
#: (~96 elements), the last one of 22 (its last block holds 2)
BLOCKS = (1198, 1024, 400_000)  # elements, width, shard bytes


@pytest.fixture(scope="module")
def noise_blocks(daemon: Any) -> str:
    n, width, shard_bytes = BLOCKS
    name = "batched-noise-blocks"
    with CacheClient(daemon.unix_target) as cc:
        x = noise(n, width).map(lambda e: e["x"])
        write_sharded(cc, x, name, shard_bytes, 50_000, block_bytes=16 << 10, batch_elements=16)
        layout = Layout.from_json(cc._get(name).layout_json)
        assert (layout.block_elements, layout.plain_raw) == (4, True)
        assert len(cc._get(name).shards) >= 3
    return name


def test_the_data_plane_receives_raw_blocks_straight_into_the_batches_tensorflow_hands_on(
    clients: dict[str, tuple[CacheClient, bool]],
    noise_blocks: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = -(-unbatched_size(4096) // 16) * 16  # batches start on a block (of 4)
    pairs = landed(clients, noise_blocks, size, monkeypatch, {})
    n = BLOCKS[0]
    assert [len(a) for a, _ in pairs] == [size] * (n // size) + [n % size]
    for a, b in pairs:
        assert (a == b).all()


@pytest.mark.parametrize(
    "opts",
    [{"start": 5}, {"shuffle": "shards", "seed": 2}, {"worker_index": 1, "num_workers": 3}],
    ids=["start", "shards", "share"],
)
def test_blocks_cut_by_a_batch_or_a_share_read_over_the_data_plane_as_directly(
    clients: dict[str, tuple[CacheClient, bool]], noise_blocks: str, opts: dict[str, Any]
) -> None:
    unix, _ = clients["direct"]
    tcp, _ = clients["plane"]
    want = [b.numpy() for b in unix.dataset(noise_blocks, direct=True, **opts).batch(16)]
    got = list(tcp.dataset(noise_blocks, direct=False, **opts).batch(16).as_numpy_iterator())
    assert [len(b) for b in got] == [len(b) for b in want]
    for a, b in zip(got, want):
        assert (a == b).all()


def test_a_corrupt_block_received_into_its_batch_raises_data_loss_naming_it(
    daemon: Any, clients: dict[str, tuple[CacheClient, bool]]
) -> None:
    n, width, shard_bytes = BLOCKS
    unix, _ = clients["direct"]
    tcp, _ = clients["plane"]
    name = "batched-noise-blocks-corrupt"
    x = noise(n, width).map(lambda e: e["x"])
    write_sharded(unix, x, name, shard_bytes, 50_000, block_bytes=16 << 10, batch_elements=16)
    element = next(iter(x.skip(21))).numpy()  # block 5 (elements 20-23) of the cache
    flip(daemon.data_dir / "caches" / name, element[:8].tobytes(), 100)
    with pytest.raises(
        tf.errors.OpError, match=r"DataLossError: .*block .*\(elements .*element 20\) is corrupt"
    ):
        for _ in tcp.dataset(name, direct=False).batch(16):
            pass
