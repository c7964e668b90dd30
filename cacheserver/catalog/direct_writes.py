"""Same-host writes: shard files a client wrote itself, checked and adopted at commit.

A client on the daemon's host may write a cache's shard files with the store's
own :class:`~client.format.store.ShardWriter` instead of streaming chunks
(client/write/direct.py). The daemon hands it a staging directory inside the
cache's own directory, ``caches/<name>/local/``, so everything that already
discards an unfinished write discards the staged files too: a cancelled or
broken WriteCache stream (the client was killed) trashes the cache directory,
and startup recovery removes a cache directory without a manifest.

At commit the daemon trusts nothing the client says without looking
(:func:`adopt`): the staging directory must hold exactly the shards named, each
a directory with a plain ``data.mdb`` (no links); each file must open as LMDB,
be as long as LMDB expects (the truncation check of the read path), hold the
record count claimed; a sample of records must pass the read path's checks
(zstd frame checksum or CRC-32, whole blocks). Then the bytes on disk are
reserved against the capacity limits (evicting as for a streamed write) and
the shard directories are renamed into place, each with its commit marker.

Knows nothing of gRPC. docs/writing.md ("Same-host writes") has the decisions.
"""

from __future__ import annotations

import errno
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cacheserver.catalog.manifest import CacheRecord, ShardInfo, du
from client.format.blocks import block_elements, block_geometry, unpack_block
from client.format.codec import RecordError
from client.format.store import ReaderPool, ShardGetter, disk_full
from client.format.values import Decompressor
from client.wire.status import DataLoss, InvalidArgument

#: The staging directory's name inside the cache's directory.
STAGING = "local"
#: Records checked per shard at commit: all of a shard up to this many, else the first,
#: the last and a random sample.
SAMPLE_RECORDS = 32
_FILES = {"data.mdb", "lock.mdb"}
_REBUILD = "the write is discarded; the next epoch writes the cache again"


@dataclass(frozen=True)
class StagedShard:
    """What the writer says one staged shard holds (WriteFinish.staged_shards)."""

    index: int
    num_elements: int
    num_records: int
    stored_bytes: int
    raw_bytes: int


def make(cache_dir: Path) -> Path:
    """Create the staging directory of the cache being written in cache_dir."""
    staging = cache_dir / STAGING
    try:
        staging.mkdir()
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise disk_full(staging) from exc
        raise
    return staging


def _check_claims(name: str, claims: Sequence[StagedShard], k: int) -> None:
    for i, c in enumerate(claims):
        if c.index != i:
            raise InvalidArgument(
                f"cache {name!r}: staged shard {i} says it is shard "
                f"{c.index}; shards must be numbered 0, 1, ... in order"
            )
        whole = c.num_elements == c.num_records * k
        short_last = (
            i == len(claims) - 1 and (c.num_records - 1) * k < c.num_elements < c.num_records * k
        )
        if c.num_records < 1 or not (whole or short_last):
            raise InvalidArgument(
                f"cache {name!r}: staged shard {i} says {c.num_elements} "
                f"elements in {c.num_records} values of {k}; only the "
                "last value of the last shard may hold fewer"
            )


def _check_listing(name: str, staging: Path, claims: Sequence[StagedShard]) -> list[Path]:
    expected = [f"shard-{c.index:05d}" for c in claims]
    found = sorted(p.name for p in staging.iterdir())
    if found != expected:
        raise DataLoss(
            f"cache {name!r}: the staging directory {staging} holds {found}, the "
            f"writer says {expected}; {_REBUILD}"
        )
    paths = [staging / n for n in expected]
    for path in paths:
        if path.is_symlink() or not path.is_dir():
            raise DataLoss(f"cache {name!r}: staged {path} is not a directory; {_REBUILD}")
        files = {p.name for p in path.iterdir()}
        data = path / "data.mdb"
        if not files <= _FILES or data.is_symlink() or not data.is_file():
            raise DataLoss(
                f"cache {name!r}: staged {path} must hold a plain data.mdb and "
                f"nothing else, not {sorted(files)}; {_REBUILD}"
            )
        (path / "lock.mdb").unlink(missing_ok=True)  # readers use lock=False (store.py)
    return paths


def _sample(num_records: int, rng: random.Random) -> list[int]:
    if num_records <= SAMPLE_RECORDS:
        return list(range(num_records))
    picked = {0, num_records - 1, *rng.sample(range(1, num_records - 1), SAMPLE_RECORDS - 2)}
    return sorted(picked)


def _check_shard(
    name: str, path: Path, claim: StagedShard, layout_json: str, rng: random.Random
) -> None:
    k, size = block_geometry(layout_json)
    pool = ReaderPool()
    pool.MAX_IDLE = 0  # closed on release: the directory is renamed next
    where = f"cache {name!r}: staged shard {claim.index}"
    try:
        env = pool.hold(path)  # DataLoss for a file LMDB cannot open or a truncated one
    except DataLoss as exc:
        raise DataLoss(f"{where}: {exc}; {_REBUILD}") from exc
    try:
        if env.num_records != claim.num_records:
            raise DataLoss(
                f"{where} holds {env.num_records} values, the writer says "
                f"{claim.num_records}; {_REBUILD}"
            )
        if claim.stored_bytes > env.file_bytes:
            raise DataLoss(
                f"{where}: the writer says {claim.stored_bytes} stored bytes in a "
                f"{env.file_bytes}-byte file; {_REBUILD}"
            )
        picked = _sample(claim.num_records, rng)
        keys = b"".join(i.to_bytes(8, "big") for i in picked)
        values = ShardGetter(env, path).get_many(keys)
        dec = Decompressor()
        for index, value in zip(picked, values):
            try:
                if k == 1:
                    dec.unpack(value)
                    continue
                body, _ = unpack_block(dec, value, k, size)
                if index < claim.num_records - 1 and len(body) != k * size:
                    raise RecordError(f"block holds {len(body) // size} elements, not {k}")
            except RecordError as exc:
                raise DataLoss(f"{where}: record {index} is corrupt ({exc}); {_REBUILD}") from exc
    finally:
        pool.release(path, env)


def adopt(
    record: CacheRecord,
    cache_dir: Path,
    staging: Path,
    claims: Sequence[StagedShard],
    reserve: Callable[[int], None],
) -> None:
    """Check the staged shards, reserve their bytes on disk (reserve may evict or raise
    CapacityExceeded), then move them into cache_dir as committed shards of record."""
    _check_claims(record.name, claims, block_elements(record.layout_json))
    paths = _check_listing(record.name, staging, claims)
    rng = random.Random()
    for path, claim in zip(paths, claims):
        _check_shard(record.name, path, claim, record.layout_json, rng)
    reserve(du(staging))
    first = record.num_elements
    for path, c in zip(paths, claims):
        path.rename(cache_dir / path.name)
        record.add_shard(
            cache_dir, ShardInfo(c.index, first, c.num_elements, c.stored_bytes, c.raw_bytes)
        )
        first += c.num_elements
    shutil.rmtree(staging, ignore_errors=True)
