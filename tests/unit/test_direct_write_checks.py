"""cacheserver/catalog/direct_writes.py: what the daemon checks before adopting a client's shard
files
(real LMDB files in a temp dir; no daemon)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cacheserver.catalog import direct_writes
from cacheserver.catalog.manifest import CacheRecord
from client.format.blocks import BlockPacker, blocked
from client.format.layout import Layout, Leaf
from client.format.store import ShardWriter
from client.format.values import Compressor
from client.wire.status import DataLoss, InvalidArgument

LAYOUT = Layout((Leaf("uint8", (4096,)),))


def _record(layout: Layout = LAYOUT) -> CacheRecord:
    return CacheRecord("c", "f", layout.to_json(), b"", "WRITING", 0.0)


def _stage(
    tmp_path: Path, shards: list[list[bytes]], k: int = 1
) -> tuple[Path, Path, list[direct_writes.StagedShard]]:
    cache_dir = tmp_path / "caches" / "c"
    cache_dir.mkdir(parents=True)
    where = direct_writes.make(cache_dir)
    claims = []
    for i, values in enumerate(shards):
        writer = ShardWriter(where / f"shard-{i:05d}", 1 << 20)
        writer.append(values, sum(map(len, values)), None if k == 1 else len(values) * k)
        writer.commit()
        claims.append(
            direct_writes.StagedShard(
                i, writer.num_elements, writer.num_records, writer.stored_bytes, writer.raw_bytes
            )
        )
    return cache_dir, where, claims


def _values(n: int) -> list[bytes]:
    return [Compressor().pack(os.urandom(4096)) for _ in range(n)]


def test_adopted_shards_move_into_the_cache_with_markers_and_reserve_their_bytes(
    tmp_path: Path,
) -> None:
    cache_dir, where, claims = _stage(tmp_path, [_values(3), _values(2)])
    record, reserved = _record(), []
    direct_writes.adopt(record, cache_dir, where, claims, reserved.append)
    assert [(s.first_element, s.num_elements) for s in record.shards] == [(0, 3), (3, 2)]
    assert sorted(p.name for p in cache_dir.iterdir()) == [
        "shard-00000",
        "shard-00000.json",
        "shard-00001",
        "shard-00001.json",
    ]
    assert reserved and reserved[0] >= 5 * 4096


def test_a_symlink_instead_of_a_data_file_is_refused(tmp_path: Path) -> None:
    cache_dir, where, claims = _stage(tmp_path, [_values(2)])
    data = where / "shard-00000" / "data.mdb"
    elsewhere = tmp_path / "elsewhere.mdb"
    data.rename(elsewhere)
    data.symlink_to(elsewhere)
    with pytest.raises(DataLoss, match=r"must hold a plain data\.mdb"):
        direct_writes.adopt(_record(), cache_dir, where, claims, lambda n: None)


def test_a_shard_the_writer_does_not_name_is_refused(tmp_path: Path) -> None:
    cache_dir, where, claims = _stage(tmp_path, [_values(2), _values(2)])
    with pytest.raises(
        DataLoss,
        match=r"holds \['shard-00000', 'shard-00001'\], the writer "
        r"says \['shard-00000'\]",
    ):
        direct_writes.adopt(_record(), cache_dir, where, claims[:1], lambda n: None)


def test_shards_out_of_order_are_refused_before_any_file_is_opened(tmp_path: Path) -> None:
    cache_dir, where, claims = _stage(tmp_path, [_values(1), _values(1)])
    with pytest.raises(InvalidArgument, match=r"numbered 0, 1, \.\.\. in order"):
        direct_writes.adopt(_record(), cache_dir, where, claims[::-1], lambda n: None)


def test_a_short_block_anywhere_but_at_the_very_end_is_refused(tmp_path: Path) -> None:
    layout = blocked(LAYOUT, 4 * 4096)
    assert layout.block_elements == 4
    packer = BlockPacker(layout)
    rows = np.frombuffer(os.urandom(6 * 4096), np.uint8).reshape(6, 4096)
    values, _, n = packer.add([rows], 6)
    last, _, m = packer.flush()
    cache_dir, where, claims = _stage(tmp_path, [list(values), list(last)], k=4)
    claims = [
        direct_writes.StagedShard(0, 3, 1, claims[0].stored_bytes, 0),  # a short first shard
        direct_writes.StagedShard(1, 3, 1, claims[1].stored_bytes, 0),
    ]
    with pytest.raises(InvalidArgument, match="only the last value of the last shard"):
        direct_writes.adopt(_record(layout), cache_dir, where, claims, lambda n: None)
    assert (n, m) == (4, 2)


def test_a_record_failing_its_checksum_is_refused_as_data_loss(tmp_path: Path) -> None:
    values = _values(3)
    cache_dir, where, claims = _stage(tmp_path, [values])
    data = where / "shard-00000" / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(values[1][2000:2100])
    raw[at] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(DataLoss, match="record 1 is corrupt"):
        direct_writes.adopt(_record(), cache_dir, where, claims, lambda n: None)
