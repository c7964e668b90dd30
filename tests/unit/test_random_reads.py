"""Random access to a shard's elements: values as views into the map, one-element blocks
joined before they are unshuffled, several leaves copied into one array, and chunks cut
on a consumer's batches. Each path gives the same elements as the general one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from client.format.blocks import BlockPacker, blocked, decode_values, shuffle
from client.format.codec import decode_fixed
from client.format.fixed_decode import ALIGN, decode_into, handles
from client.format.layout import Layout, Leaf
from client.format.lookup import gather_chunks
from client.format.store import ReaderPool, ShardWriter
from client.format.values import Compressor, Decompressor, split_chunk
from client.read.assembly.buffers import Buffers
from tests.unit.test_blocks import batch_of

SMALL = Layout((Leaf("float32", (256,)), Leaf("int64", ())))  # 1 KB records


@pytest.fixture(autouse=True)
def own_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test counts and budgets value tables of its own: tables that earlier tests in
    the same process left behind would otherwise be counted, dropped or found."""
    from client.format import store

    monkeypatch.setattr(store, "_TABLES", store._Tables())


def shard(path: Path, layout: Layout, data: list[np.ndarray], n: int) -> Path:
    packer = BlockPacker(layout)
    values, raw, count = packer.add(data, n)
    last, raw_last, count_last = packer.flush()
    writer = ShardWriter(path, 1 << 20)
    writer.append(values + last, raw + raw_last, count + count_last)
    writer.commit()
    return path


@pytest.mark.parametrize("block_bytes", [0, 16 << 10])
def test_gathered_values_as_views_are_the_values_the_joined_chunks_hold(
    tmp_path: Path, block_bytes: int
) -> None:
    layout = blocked(SMALL, block_bytes) if block_bytes else SMALL
    data = batch_of(layout, 300, np.random.default_rng(4))
    path = shard(tmp_path / "shard", layout, data, 300)
    wanted = np.random.default_rng(5).permutation(300)[:100].astype(np.uint64)
    pool = ReaderPool()
    held = pool.hold(path)
    try:

        def opened(_: int) -> object:
            return pool.opened(path)

        firsts = np.zeros(1, np.uint64)
        joined = list(gather_chunks(opened, wanted, firsts, 7, layout.to_json(), "test"))
        views = list(
            gather_chunks(opened, wanted, firsts, 100, layout.to_json(), "test", views=True)
        )
        assert len(views) == 1 and views[0][0] == 0 and views[0][1] == b""
        assert [bytes(v) for v in views[0][2]] == [
            bytes(v) for _, lengths, data in joined for v in split_chunk(lengths, data)
        ]
        n, got = decode_values(layout, Decompressor(), views[0][2])
        assert n == 100
        for have, original in zip(got, data):
            np.testing.assert_array_equal(have, original[wanted.astype(np.int64)])
    finally:
        pool.release(path, held)


@pytest.mark.parametrize("plain_raw", [True, False])
def test_elements_cut_out_of_their_blocks_decode_into_their_rows(plain_raw: bool) -> None:
    """A shuffled read of a cache in blocks gets one-element raw blocks (client/format/lookup.py),
    as they are (format 4) or each shuffled on its own (formats 2 and 3): decode_into joins
    them and copies (or unshuffles) all in one step."""
    fresh = blocked(Layout((Leaf("float32", (3, 5)), Leaf("int16", (7,)))), 4096)
    layout = fresh if plain_raw else Layout(fresh.leaves, fresh.block_elements, 2)
    assert layout.block_elements > 1 and layout.block_shuffle == 2 and handles(layout)
    data = batch_of(layout, 40, np.random.default_rng(6))
    rows = np.concatenate([a.reshape(40, -1).view(np.uint8) for a in data], axis=1)
    stride = 1 if plain_raw else 2
    pack = Compressor().pack
    values = [
        pack(shuffle(np.ascontiguousarray(rows[i : i + 1]), stride).tobytes(), compress=False)
        for i in range(40)
    ]
    n, got = decode_into(layout, Decompressor(), values)
    assert n == 40
    for have, original in zip(got, data):
        np.testing.assert_array_equal(have, original)


def test_several_leaves_of_a_large_batch_are_copied_into_one_array_from_empty() -> None:
    data = batch_of(SMALL, 600, np.random.default_rng(7))  # 600 KB: one shared array
    joined = np.concatenate([a.reshape(600, -1).view(np.uint8) for a in data], axis=1)
    buffers = Buffers()
    got = decode_fixed(SMALL, joined.tobytes(), 600, buffers.empty)
    assert buffers.made == 1
    for have, original in zip(got, data):
        assert have.flags.c_contiguous and have.ctypes.data % ALIGN == 0
        np.testing.assert_array_equal(have, original)
    few = decode_fixed(SMALL, joined[:3].tobytes(), 3, buffers.empty)  # own arrays
    assert buffers.made == 1
    for have, original in zip(few, data):
        np.testing.assert_array_equal(have, original[:3])


def test_lookups_past_passes_of_a_shard_slice_its_values_from_the_map_as_lmdb_gives_them(
    tmp_path: Path,
) -> None:
    """After TABLE_AFTER_PASSES passes' worth of lookups by index a shard's values are sliced
    from its map by a table of where each lies: the same bytes LMDB's lookups give, views or
    copies, in any order; an index past the shard's end is still named as missing."""
    from client.format import store
    from client.wire.status import DataLoss

    data = batch_of(SMALL, 300, np.random.default_rng(6))
    path = shard(tmp_path / "shard", SMALL, data, 300)
    pool = ReaderPool()
    order = np.random.default_rng(7).permutation(300).astype(">u8")
    with pool.opened(path) as getter:
        for _ in range(store.TABLE_AFTER_PASSES):  # passes by LMDB
            looked_up = [bytes(v) for v in getter.get_many(order.tobytes())]
        assert getter._ent._values is None
    walked = []
    made = store._Offsets.__init__

    def recorded(self: store._Offsets, *args: object) -> None:
        made(self, *args)  # type: ignore[arg-type]
        walked.append(self)

    with pytest.MonkeyPatch.context() as patch, pool.opened(path) as getter:
        patch.setattr(store._Offsets, "__init__", recorded)
        views = getter.get_many(order.tobytes(), views=True)
        copies = getter.get_many(order[::-1].tobytes())
        assert len(walked) == 1  # the table, walked once for both
        assert [bytes(v) for v in views] == looked_up
        assert all(isinstance(v, memoryview) and v.readonly for v in views)
        assert copies == looked_up[::-1] and all(type(v) is bytes for v in copies)
        for missing in (300, 2**64 - 1):  # past the end; negative as an int64
            with pytest.raises(DataLoss, match=f"missing record {missing}"):
                getter.get_many(np.array([5, missing], ">u8").tobytes())


def test_a_shard_whose_keys_are_not_its_value_indices_is_looked_up_by_lmdb(
    tmp_path: Path,
) -> None:
    import lmdb

    from client.format import store

    path = tmp_path / "shard"
    env = lmdb.open(str(path), map_size=1 << 20)
    with env.begin(write=True) as txn:  # a gap: keys 0, 1, 3 (a 4th key of 4 bytes)
        for key in ((0).to_bytes(8, "big"), (1).to_bytes(8, "big"), (3).to_bytes(8, "big")):
            txn.put(key, key * 4)
        txn.put(b"\xff" * 4, b"odd")
    env.close()
    with ReaderPool().opened(path) as getter:
        keys = np.array([0, 1, 3, 1, 0], ">u8").tobytes()
        for _ in range(store.TABLE_AFTER_PASSES + 1):  # past the lookups before a table
            assert getter.get_many(keys) == [k.to_bytes(8, "big") * 4 for k in (0, 1, 3, 1, 0)]
        ent: store._Env = getter._ent
        assert ent._values is None and ent._no_table


def test_values_of_several_sizes_are_sliced_from_the_map_at_their_own_sizes(
    tmp_path: Path,
) -> None:
    import lmdb

    from client.format import store

    path = tmp_path / "shard"
    env = lmdb.open(str(path), map_size=1 << 20)
    stored = [bytes([i]) * (1 + 700 * i) for i in range(6)]  # in leaf and overflow pages
    with env.begin(write=True) as txn:
        for i, value in enumerate(stored):
            txn.put(i.to_bytes(8, "big"), value)
    env.close()
    with ReaderPool().opened(path) as getter:
        keys = np.array([5, 0, 3, 1, 4, 2], ">u8").tobytes()
        for _ in range(store.TABLE_AFTER_PASSES + 1):  # passes by LMDB, then the table
            got = getter.get_many(keys, views=True)
            assert [bytes(v) for v in got] == [stored[i] for i in (5, 0, 3, 1, 4, 2)]
        assert getter._ent._values is not None


def test_value_tables_share_one_budget_and_one_unused_makes_room_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's tables together stay within TABLE_BYTES: a shard whose table does not fit
    beside one in use keeps LMDB's lookups (the same values), and gets one once the other
    shard closes (its unused table is dropped to make room)."""
    from client.format import store

    data = batch_of(SMALL, 300, np.random.default_rng(8))
    paths = [shard(tmp_path / f"shard-{k}", SMALL, data, 300) for k in range(2)]
    monkeypatch.setattr(store, "TABLE_BYTES", 12 * 300)  # room for one
    pool = ReaderPool()
    envs = [pool.hold(path) for path in paths]
    keys = np.arange(300, dtype=">u8").tobytes()
    try:
        want = [bytes(v) for v in store.ShardGetter(envs[0], paths[0]).get_many(keys)]
        for _ in range(store.TABLE_AFTER_PASSES + 1):  # by LMDB, then the table where it fits
            for env, path in zip(envs, paths):
                assert store.ShardGetter(env, path).get_many(keys) == want
        assert envs[0]._values is not None and envs[1]._values is None
        pool.release(paths[0], envs.pop(0))
        pool.forget(tmp_path)  # closed: its table is no longer in use
        assert store.ShardGetter(envs[0], paths[1]).get_many(keys) == want
        assert envs[0]._values is not None
        assert store._TABLES.nbytes <= store.TABLE_BYTES
    finally:
        for env, path in zip(envs, paths[-len(envs) :]):
            pool.release(path, env)


def test_a_table_outlives_its_environment_and_a_later_open_of_the_file_slices_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass of cc.numpy() or cc.torch() opens its shards afresh: the lookups of one open
    count towards the table of the next, and the table found once serves every later
    open of the same file, bound to that open's own map."""
    from client.format import store

    data = batch_of(SMALL, 300, np.random.default_rng(9))
    path = shard(tmp_path / "shard", SMALL, data, 300)
    pool = ReaderPool()
    pool.MAX_IDLE = 0  # as a direct reader's: closed between passes
    keys = np.random.default_rng(10).permutation(300).astype(">u8").tobytes()
    walks = []
    made = store._Offsets.__init__

    def recorded(self: store._Offsets, *args: object) -> None:
        made(self, *args)  # type: ignore[arg-type]
        walks.append(self)

    monkeypatch.setattr(store._Offsets, "__init__", recorded)
    passes, bound = [], []
    for _ in range(store.TABLE_AFTER_PASSES + 3):
        with pool.opened(path) as getter:
            passes.append([bytes(v) for v in getter.get_many(keys, views=True)])
            if getter._ent._values is not None:
                bound.append(getter._ent._values)
    assert len(walks) == 1  # in the open after the passes of lookups
    # the second, third and fourth opens sliced their own maps by the one table
    assert len({id(values) for values in bound}) == 3
    assert len({id(values.starts) for values in bound}) == 1
    assert all(p == passes[0] for p in passes)


def test_a_table_is_not_bound_to_a_file_whose_values_lie_elsewhere(tmp_path: Path) -> None:
    """Bound to another open, a table first checks that its anchor and its last value are
    where it says: a file of other values (had its identity matched) is refused."""
    import lmdb

    from client.format import store

    def env_of(name: str, sizes: list[int]) -> lmdb.Environment:
        env = lmdb.open(str(tmp_path / name), map_size=1 << 20)
        with env.begin(write=True) as txn:
            for i, size in enumerate(sizes):
                txn.put(i.to_bytes(8, "big"), bytes([i]) * size)
        return env

    one = env_of("one", [100] * 20)
    offsets = store._Offsets(one, 20)
    store._Values(offsets, one)  # binds to its own file
    for other in (env_of("longer", [150] * 20), env_of("moved", [40] + [100] * 19)):
        with pytest.raises(ValueError, match="not where its table says"):
            store._Values(offsets, other)


def test_a_process_counts_lookups_of_at_most_table_counts_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files looked up by index are counted towards a table in a bounded list: past
    TABLE_COUNTS, the least recently counted file without a table is forgotten (its count
    starts again), and a file with a table keeps it."""
    from client.format import store

    tables = store._TABLES
    monkeypatch.setattr(store, "TABLE_COUNTS", 2)
    data = batch_of(SMALL, 300, np.random.default_rng(11))
    paths = [shard(tmp_path / f"shard-{k}", SMALL, data, 300) for k in range(4)]
    pool = ReaderPool()
    keys = np.arange(300, dtype=">u8").tobytes()
    want = None
    with pool.opened(paths[0]) as getter:
        for _ in range(store.TABLE_AFTER_PASSES + 1):
            want = getter.get_many(keys)
        assert getter._ent._values is not None  # paths[0] has its table
    for path in paths[1:]:
        with pool.opened(path) as getter:
            assert getter.get_many(keys) == want
        assert len(tables._counts) <= 2
    with pool.opened(paths[0]) as getter:  # kept: a file with a table is not forgotten
        assert getter.get_many(keys) == want and getter._ent._values is not None
