"""Read leases on a real catalog in a temp dir, without gRPC: expiry, renewal, eviction."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.leases import TOKEN_FILE, LeaseTable
from client.format.store import ReaderPool
from client.wire.status import CacheNotFound, FingerprintMismatch, LeaseNotFound


def _write(cat: Catalog, name: str, n: int = 10) -> None:
    _, _, session = cat.begin_write(name, "fp", "{}", b"", 64)
    assert session is not None
    for i in range(n):
        session.append([f"record-{i}".encode()], 8)
    session.finish(n)


def _wait(predicate, what: str, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {deadline_s:g}s")
        time.sleep(0.01)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(tmp_path / "data")


@pytest.fixture
def table(catalog: Catalog) -> Iterator[LeaseTable]:
    t = LeaseTable(catalog, ttl=0.3)
    t.start()
    yield t
    t.stop()


def test_the_token_file_holds_the_token_the_leases_carry(catalog, table) -> None:
    assert (catalog.data_dir / TOKEN_FILE).read_text().strip() == table.token
    assert table.token_path == (catalog.data_dir / TOKEN_FILE).resolve()
    assert LeaseTable(catalog).token != table.token, "a restarted daemon proves itself anew"


def test_a_lease_names_the_absolute_directory_of_every_committed_shard(catalog, table) -> None:
    _write(catalog, "c")
    lease, record, paths = table.acquire("c", "fp", epoch_start=True)
    assert len(paths) == len(record.shards) > 1
    assert all(p.is_absolute() and (p / "data.mdb").is_file() for p in paths)
    assert not any((p / "lock.mdb").exists() for p in paths), "committed shards need no lock"
    table.release(lease.id)


def test_a_leased_cache_is_neither_evicted_nor_expired_until_the_lease_ends(catalog, table) -> None:
    _write(catalog, "c")
    catalog.set_retention("c", None, 0.01)
    far = time.time() + 3600
    lease, _, _ = table.acquire("c", "fp", epoch_start=True)
    assert catalog.eviction_candidate(exclude="") is None
    assert catalog.expired(far) == []
    assert not catalog.evict("c", "capacity")
    assert table.counts("c") == (1, 1)
    table.release(lease.id)
    assert table.counts("c") == (0, 1)
    assert catalog.eviction_candidate(exclude="") == "c"
    assert catalog.expired(far) == ["c"]


def test_a_lease_not_renewed_expires_and_renewing_it_then_is_refused(catalog, table) -> None:
    _write(catalog, "c")
    lease, _, _ = table.acquire("c", "fp", epoch_start=False)
    assert table.counts("c") == (1, 0), "a lease without epoch_start is no pass"
    _wait(lambda: table.counts("c")[0] == 0, "expiry")
    assert catalog.eviction_candidate(exclude="") == "c"
    with pytest.raises(LeaseNotFound, match="expired or was released"):
        table.renew(lease.id)
    table.release(lease.id)  # releasing an expired lease is not an error


def test_renewing_keeps_a_lease_alive_past_its_ttl(catalog, table) -> None:
    _write(catalog, "c")
    lease, _, _ = table.acquire("c", "fp", epoch_start=True)
    until = time.monotonic() + 3 * table.ttl
    while time.monotonic() < until:
        assert table.renew(lease.id) == table.ttl
        assert table.counts("c")[0] == 1
        time.sleep(table.ttl / 4)  # the client's cadence (a third of the TTL), not a sync
    table.release(lease.id)


def test_a_lease_on_a_missing_or_replaced_cache_is_refused(catalog, table) -> None:
    with pytest.raises(CacheNotFound):
        table.acquire("nope", "", epoch_start=True)
    _write(catalog, "c")
    with pytest.raises(FingerprintMismatch):
        table.acquire("c", "other", epoch_start=True)
    assert table.counts("c") == (0, 0)


def test_a_held_shard_keeps_serving_after_its_cache_is_deleted(catalog, table) -> None:
    _write(catalog, "c")
    _, record, paths = table.acquire("c", "fp", epoch_start=True)
    pool = ReaderPool()
    held = [pool.hold(p) for p in paths]
    catalog.delete("c")
    assert not paths[0].exists()
    chunks = list(
        pool.read_chunks(paths[0], 0, record.shards[0].num_elements, 1 << 20, held=held[0])
    )
    assert chunks[0][2].startswith(b"record-0")
    for p, env in zip(paths, held):
        pool.release(p, env)
