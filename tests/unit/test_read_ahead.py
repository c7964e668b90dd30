"""ReadAhead (client/format/read_ahead.py): evicted pages read ahead of a reader, the
windows a whole stream pulls in, and the steps it leaves alone because they are in already."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
from pathlib import Path

import pytest

from client.format import read_ahead
from client.format.read_ahead import NEED_BYTES, STEP_BYTES, WINDOW_BYTES, ReadAhead, ReadAheads
from client.format.store import ReaderPool, ShardWriter

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident(path: Path, start: int, stop: int) -> float:
    """Share of the pages of path's bytes [start, stop) in the page cache (mincore(2) on a map
    that is never touched, so that looking does not read them)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            pages = -(-(stop - start) // PAGE)
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr + start, stop - start, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(v & 1 for v in vec) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: Path, start: int = 0, stop: int = 0) -> None:
    """Drop path's clean pages [start, stop) (0: to the end) from the page cache; skips the
    test where the filesystem keeps them (tmpfs)."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), start, stop - start if stop else 0, os.POSIX_FADV_DONTNEED)
    if resident(path, start, stop or os.path.getsize(path)) > 0.05:
        pytest.skip("this filesystem keeps evicted pages (tmpfs?): nothing to read ahead")


@pytest.fixture
def evicted(tmp_path: Path) -> Path:
    """A 96 MiB data.mdb with none of its pages in the page cache."""
    path = tmp_path / "data.mdb"
    with open(path, "wb") as f:
        for _ in range(96):
            f.write(os.urandom(1 << 20))
    evict(path)
    return path


def test_a_reader_waits_until_the_pages_of_its_next_chunk_are_in_and_no_further_than_the_window(
    evicted: Path,
) -> None:
    size = 96 << 20
    ahead = ReadAhead(evicted.parent, size, num_records=96)  # one record per MiB
    try:
        ahead.at(40)  # a range read starting mid-file
        assert resident(evicted, 40 << 20, (40 << 20) + NEED_BYTES) == 1.0
        assert resident(evicted, 0, 32 << 20) < 0.05, "nothing before the reader is read"
    finally:
        ahead.close()
    assert resident(evicted, (40 << 20) + WINDOW_BYTES + (8 << 20), size) < 0.05


def test_a_deleted_file_gives_no_read_ahead_and_no_error(tmp_path: Path) -> None:
    ahead = ReadAhead(tmp_path, 1 << 20, num_records=10)  # no data.mdb here
    ahead.at(5)
    ahead.close()


def kernel_readahead(path: Path) -> int:
    """The kernel's own readahead for path's device, in bytes (read_ahead_kb of its queue;
    a partition's is its disk's), or WINDOW_BYTES where sysfs does not say."""
    dev = os.stat(path).st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (block / "queue", block.parent / "queue" if block.exists() else block):
        with contextlib.suppress(OSError, ValueError):
            return int((queue.resolve() / "read_ahead_kb").read_text()) << 10
    return WINDOW_BYTES


def test_a_range_read_reads_ahead_no_further_than_its_range(evicted: Path) -> None:
    ahead = ReadAhead(evicted.parent, 96 << 20, num_records=96, stop=10)
    try:
        ahead.at(8)
        assert resident(evicted, 8 << 20, 10 << 20) == 1.0
    finally:
        ahead.close()
    # the read-ahead reads to the range's end and a step more; the kernel may read its own
    # readahead past that (read_ahead_kb, 8 MiB on some disks); a read-ahead past its range
    # would fill its window, WINDOW_BYTES from the reader
    beyond = (10 << 20) + STEP_BYTES + kernel_readahead(evicted)
    window_end = (8 << 20) + WINDOW_BYTES
    if beyond + (8 << 20) > window_end:
        pytest.skip("the kernel's readahead reaches as far as a read-ahead's window")
    assert resident(evicted, beyond, window_end) < 0.05, "read past the range"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (offset, bytes) of every window the read-ahead thread pulls in, and still do it."""
    calls: list[tuple[int, int]] = []
    real = os.sendfile

    def record(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        done = real(out_fd, in_fd, offset, count)
        calls.append((offset, done))
        return done

    monkeypatch.setattr(read_ahead.os, "sendfile", record)
    return calls


@pytest.fixture
def every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead walks every step, as where the kernel has no cachestat(2): the walk
    itself, whatever is in the page cache already."""
    monkeypatch.setattr(read_ahead, "_syscall", None)


def _shard(tmp_path: Path, records: int, size: int) -> Path:
    writer = ShardWriter(tmp_path / "shard-00000", records * size)
    for i in range(records):
        writer.append([bytes([i % 251]) * size], size)
    writer.commit()
    return tmp_path / "shard-00000"


def _read_all(path: Path, records: int) -> None:
    chunks = ReaderPool().read_chunks(path, 0, records, 1 << 20)
    assert sum(len(lengths) // 4 for _, lengths, _ in chunks) == records


def _require_cachestat(path: Path) -> None:
    """Skip unless the kernel says all of path's pages are in (cachestat(2), Linux 6.5+)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if not read_ahead.cached(fd, 0, os.path.getsize(path)):
            pytest.skip("no cachestat(2) here (Linux < 6.5, or a seccomp profile refuses it)")
    finally:
        os.close(fd)


def test_a_warm_shard_is_read_without_walking_its_pages(
    tmp_path: Path, sent: list[tuple[int, int]]
) -> None:
    """Every page of a just-written shard is in the page cache: the read-ahead asks the
    kernel and walks none of them (a sendfile walk was ~15% of a warm pass's CPU)."""
    path = _shard(tmp_path, records=200, size=512 << 10)
    _require_cachestat(path / "data.mdb")
    _read_all(path, 200)
    assert sent == []


def test_only_the_evicted_part_of_a_warm_shard_is_walked(
    tmp_path: Path, sent: list[tuple[int, int]]
) -> None:
    path = _shard(tmp_path, records=200, size=512 << 10)
    data = path / "data.mdb"
    _require_cachestat(data)
    evict(data, 40 << 20, 60 << 20)
    _read_all(path, 200)
    assert sent, "the evicted pages were not read ahead"
    first, last = sent[0][0], sent[-1][0] + sent[-1][1]
    # walked in whole steps over the hole (the kernel may keep a large folio at its edges),
    # none of the warm pages away from it; every page in at the end
    assert first >= (40 << 20) - STEP_BYTES and last <= (60 << 20) + STEP_BYTES
    assert sum(length for _, length in sent) <= (20 << 20) + 2 * STEP_BYTES
    assert resident(data, 0, os.path.getsize(data)) == 1.0


def test_without_cachestat_a_warm_shard_is_walked_whole(
    tmp_path: Path, sent: list[tuple[int, int]], every_step: None
) -> None:
    path = _shard(tmp_path, records=200, size=512 << 10)
    _read_all(path, 200)
    assert sum(length for _, length in sent) == (path / "data.mdb").stat().st_size


def test_a_sequential_stream_pulls_in_its_file_window_by_window_to_the_end(
    tmp_path: Path, sent: list[tuple[int, int]], every_step: None
) -> None:
    path = _shard(tmp_path, records=200, size=512 << 10)  # ~100 MiB: several windows
    got = sum(
        len(lengths) // 4 for _, lengths, _ in ReaderPool().read_chunks(path, 0, 200, 1 << 20)
    )
    assert got == 200
    file_bytes = (path / "data.mdb").stat().st_size
    assert sent[0][0] == 0
    # contiguous, never pulling a byte twice, covering the file to its end
    for (offset, length), (next_offset, _) in itertools.pairwise(sent):
        assert next_offset == offset + length
    assert sent[-1][0] + sent[-1][1] == file_bytes
    assert all(length <= STEP_BYTES for _, length in sent)


def test_a_stream_resumed_mid_shard_starts_reading_ahead_where_it_resumes(
    tmp_path: Path, sent: list[tuple[int, int]], every_step: None
) -> None:
    path = _shard(tmp_path, records=200, size=512 << 10)
    list(ReaderPool().read_chunks(path, 150, 200, 1 << 20))
    file_bytes = (path / "data.mdb").stat().st_size
    assert sent[0][0] >= file_bytes * 0.7  # not from the start of the file


def test_requests_a_chunk_at_a_time_sharing_their_read_aheads_pull_each_page_once(
    tmp_path: Path, sent: list[tuple[int, int]], every_step: None
) -> None:
    """The daemon's data plane answers a pass one chunk a request: with the connection's
    ReadAheads each page is pulled in once, by one thread, however many requests there are
    (one read-ahead per request pulled each range and a step past it again)."""
    path = _shard(tmp_path, records=200, size=512 << 10)
    pool, aheads = ReaderPool(), ReadAheads()
    threads = set()
    made = read_ahead.ReadAhead.__init__

    def counted(self: ReadAhead, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)  # type: ignore[arg-type]
        threads.add(id(self))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(read_ahead.ReadAhead, "__init__", counted)
        try:
            for start in range(0, 200, 4):  # 2 MiB requests
                list(pool.read_chunks(path, start, start + 4, 1 << 20, aheads=aheads))
        finally:
            aheads.close()
    assert len(threads) == 1
    pulled = sorted(sent)
    for (offset, length), (next_offset, _) in itertools.pairwise(pulled):
        assert next_offset == offset + length, "a page pulled twice, or a gap"


def test_a_shard_file_replaced_between_requests_gets_a_read_ahead_of_its_own(
    tmp_path: Path,
) -> None:
    aheads = ReadAheads(limit=2)
    try:
        first = aheads.get(tmp_path, "opened once", 1 << 20, 10)
        assert aheads.get(tmp_path, "opened once", 1 << 20, 10) is first
        again = aheads.get(tmp_path, "opened again", 1 << 20, 10)
        assert again is not first
        assert first._closed  # closed once replaced
        for other in ("a", "b"):  # the least recently used goes past the limit
            aheads.get(tmp_path / other, "x", 1 << 20, 10)
        assert again._closed
    finally:
        aheads.close()
