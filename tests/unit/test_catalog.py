"""Catalog and store on real LMDB files in a temp dir, without gRPC."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheserver.catalog import reads
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.manifest import validate_name
from client.wire.status import (
    CacheNotFound,
    CacheWriting,
    DataLoss,
    FingerprintMismatch,
    InvalidArgument,
)


def _write(cat: Catalog, name: str, n: int, fp: str = "fp1", shard_bytes: int = 0) -> None:
    decision, _, session = cat.begin_write(name, fp, "{}", b"", shard_bytes)
    assert decision == "ACCEPTED" and session is not None
    for i in range(n):
        session.append([f"record-{i}".encode()], 8)
    session.finish(n)


def _read_all(cat: Catalog, name: str) -> list[bytes]:
    import numpy as np

    record = cat.get_ready(name)
    out = []
    for shard in record.shards:
        for _, lengths, data, _ in reads.read_shard(cat, name, shard.index, 0, 64):
            ends = np.cumsum(np.frombuffer(lengths, "<u4")).tolist()
            starts = [0, *ends[:-1]]
            out.extend(data[s:e] for s, e in zip(starts, ends))
    return out


@pytest.mark.parametrize(
    "bad", ["", "../x", "/abs", "a/b", "x" * 201, "tab\there", "nl\n", "-lead", ".hidden", "sp ace"]
)
def test_invalid_cache_names_are_rejected_with_a_reason(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_name(bad)


def test_committed_records_read_back_in_order_across_shards(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _write(cat, "c", 1000, shard_bytes=1000)
    record = cat.get_ready("c")
    assert len(record.shards) > 1
    assert record.num_elements == 1000
    assert _read_all(cat, "c") == [f"record-{i}".encode() for i in range(1000)]


def test_a_ready_cache_survives_a_restart_of_the_catalog(tmp_path: Path) -> None:
    _write(Catalog(tmp_path), "c", 10)
    assert _read_all(Catalog(tmp_path), "c")[9] == b"record-9"


def test_an_interrupted_write_is_discarded_at_restart(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _, _, session = cat.begin_write("c", "fp", "{}", b"")
    assert session is not None
    session.append([b"x"] * 10, 10)
    # no finish(), no abort(): as if the daemon were killed here
    cat2 = Catalog(tmp_path)
    with pytest.raises(CacheNotFound):
        cat2.get("c")
    assert not (tmp_path / "caches" / "c").exists()
    _write(cat2, "c", 3)  # the name is free again, no lock files in the way
    assert len(_read_all(cat2, "c")) == 3


def test_an_aborted_write_leaves_nothing_and_frees_the_name(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _, _, session = cat.begin_write("c", "fp", "{}", b"")
    assert session is not None
    session.append([b"x"] * 10, 10)
    session.abort()
    assert cat.list() == []
    assert list((tmp_path / "caches").iterdir()) == []


def test_a_second_writer_is_told_busy_and_a_reader_is_told_writing(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    decision, _, session = cat.begin_write("c", "fp", "{}", b"")
    assert decision == "ACCEPTED"
    assert cat.begin_write("c", "fp", "{}", b"")[0] == "BUSY"
    with pytest.raises(CacheWriting, match="WRITING"):
        cat.get_ready("c")
    assert session is not None
    session.finish(0)
    assert cat.begin_write("c", "fp", "{}", b"")[0] == "ALREADY_READY"


def test_a_different_fingerprint_for_a_ready_name_is_refused(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _write(cat, "c", 1, fp="old")
    with pytest.raises(FingerprintMismatch, match="cacheserver rm c"):
        cat.begin_write("c", "new", "{}", b"")


def test_delete_removes_the_files(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _write(cat, "c", 5)
    cat.delete("c")
    assert not (tmp_path / "caches" / "c").exists()
    with pytest.raises(CacheNotFound):
        cat.delete("c")


def test_a_finish_with_the_wrong_count_is_rejected(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _, _, session = cat.begin_write("c", "fp", "{}", b"")
    assert session is not None
    session.append([b"x"], 1)
    with pytest.raises(InvalidArgument, match="says 5 elements, sent 1"):
        session.finish(5)


def test_reading_past_the_end_of_a_shard_is_an_invalid_argument(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _write(cat, "c", 5)
    with pytest.raises(InvalidArgument, match="past the end"):
        reads.read_shard(cat, "c", 0, 6, 0)
    with pytest.raises(InvalidArgument, match="shard 3 does not exist"):
        reads.read_shard(cat, "c", 3, 0, 0)


def test_a_truncated_lmdb_file_is_reported_as_data_loss(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _write(cat, "c", 2000)
    data = tmp_path / "caches" / "c" / "shard-00000" / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(8192)
    with pytest.raises(DataLoss):
        _read_all(Catalog(tmp_path), "c")


def test_a_cache_rebuilt_while_an_old_reader_streams_serves_the_new_records(tmp_path: Path) -> None:
    cat = Catalog(tmp_path)
    _write(cat, "c", 2000)  # several 4 KiB chunks
    old = reads.read_shard(cat, "c", 0, 0, 4096)
    next(old)  # an old stream holds the shard open
    cat.delete("c")
    _, _, session = cat.begin_write("c", "fp2", "{}", b"")
    assert session is not None
    session.append([b"new-record"], 10)
    session.finish(1)
    assert _read_all(cat, "c") == [b"new-record"]
    assert sum(len(d) for _, _, d, _ in old) > 0, "the old stream keeps reading its own files"


def test_a_commit_racing_an_eviction_is_never_evicted_before_its_manifest_is_written(
    tmp_path: Path,
) -> None:
    """An eviction that picks a cache the moment it is marked READY must not delete it
    before its commit is durable: each round, one thread evicts the cache being committed
    as soon as it can while the writer finishes; no commit may fail."""
    import threading

    cat = Catalog(tmp_path)
    failures: list[BaseException] = []
    for round_ in range(150):
        name = f"c{round_}"
        _, _, session = cat.begin_write(name, "fp", "{}", b"")
        assert session is not None
        for i in range(20):
            session.append([f"record-{i}".encode() * 50], 8)
        stop = threading.Event()

        def evict_when_ready(name: str = name, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                if cat.evict(name, "test"):
                    return

        evicter = threading.Thread(target=evict_when_ready)
        evicter.start()
        try:
            session.finish(20)
        except Exception as exc:  # the bug: FileNotFoundError writing the manifest
            failures.append(exc)
        finally:
            stop.set()
            evicter.join()
    assert not failures, failures[:3]
    for d in (tmp_path / "caches").iterdir():  # evicted or whole: never a cache half gone
        assert d.name.startswith(".") or (d / "manifest.json").exists(), d
