"""Shard storage: one LMDB environment per shard. The only module importing lmdb.

Keys are shard-local value indices as big-endian u64, so a cursor walks in
order and any value can be fetched by index. A value is a stored record or, in
format 2, a block of ``block_elements`` (k) consecutive elements (client/format/blocks.py):
element e of a shard is in value e // k. The store never looks inside values.
Environments are opened without ``writemap`` and without a lock file (on a full disk a write into
either mmap is SIGBUS, not an error: the lock file's table is written through one when the
environment opens; a shard has one writer and no reader until committed) and with syncing
deferred to :meth:`ShardWriter.commit`, which fsyncs before the caller writes
the commit marker: an uncommitted shard may be lost in a crash, a committed
one may not. The writer also syncs every :data:`SYNC_EVERY_BYTES` on its way,
so that the commit's fsync has little left to wait for (docs/writing.md).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import shutil
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from client.format.read_ahead import ReadAhead, ReadAheads
from client.wire.status import DataLoss, DiskFull

_KEY = struct.Struct(">Q")
_REBUILD = "delete the cache and build it again"
_MIN_MAP_SIZE = 64 << 20
#: A shard being written is flushed to disk every this many stored bytes. Left to the
#: kernel, nothing is written back before the commit's fsync, which then waited ~0.15 s
#: for 361 MB at the end of a write-through epoch, on the epoch's clock (the
#: intermediate syncs run in the writer's thread, beside the pipeline).
SYNC_EVERY_BYTES = 32 << 20


def disk_full(path: Path) -> DiskFull:
    return DiskFull(
        f"disk full under {path.parent}: free space or delete caches "
        "(cacheserver rm NAME), then run again"
    )


def _translate(exc: lmdb.Error, path: Path, write_bytes: int = 0) -> Exception:
    """Map an lmdb error to the daemon's errors.

    LMDB reports a short write on a full disk as EIO ("Input/output error"), so
    a failed write is DiskFull when the filesystem lacks room for it.
    """
    text = str(exc)
    if "No space left" in text or (
        write_bytes and shutil.disk_usage(path).free < write_bytes + (1 << 20)
    ):
        return disk_full(path)
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError)):
        return DataLoss(f"LMDB file under {path} is corrupt: {text}; {_REBUILD}")
    return exc


class ShardWriter:
    """Appends records to a new shard; commit() makes them durable."""

    def __init__(self, path: Path, expected_bytes: int) -> None:
        self.path = path
        self.num_records = 0  # values (blocks)
        self.num_elements = 0
        self.stored_bytes = 0
        self.raw_bytes = 0
        self._unsynced = 0
        try:
            path.mkdir(parents=True, exist_ok=False)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise disk_full(path) from exc
            raise
        self._map_size = max(_MIN_MAP_SIZE, 2 * expected_bytes)
        try:
            self._env = lmdb.open(
                str(path),
                map_size=self._map_size,
                subdir=True,
                sync=False,
                metasync=False,
                writemap=False,
                readahead=False,
                max_dbs=0,
                lock=False,
            )
        except lmdb.Error as exc:
            raise _translate(exc, path) from exc

    def append(
        self, values: Sequence[bytes | memoryview], raw_bytes: int, num_elements: int | None = None
    ) -> None:
        """Store values (holding num_elements elements; default one each) as the next
        records, in one transaction."""
        items = [(_KEY.pack(self.num_records + i), v) for i, v in enumerate(values)]
        size = sum(len(v) for v in values)
        while True:
            try:
                with self._env.begin(write=True) as txn, txn.cursor() as cur:
                    cur.putmulti(items, append=True)
                break
            except lmdb.MapFullError:
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
            except lmdb.Error as exc:
                raise _translate(exc, self.path, size) from exc
        self.num_records += len(values)
        self.num_elements += len(values) if num_elements is None else num_elements
        self.stored_bytes += size
        self.raw_bytes += raw_bytes
        self._unsynced += size
        if self._unsynced >= SYNC_EVERY_BYTES:
            self._sync()

    def _sync(self) -> None:
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise _translate(exc, self.path, 1) from exc
        self._unsynced = 0

    def commit(self) -> None:
        """Flush everything to disk and close; the caller then writes the marker."""
        try:
            self._sync()
        finally:
            self._env.close()

    def abort(self) -> None:
        """Close and delete the shard's files (space is released now)."""
        try:
            self._env.close()
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


#: What the value tables of a process may hold together (_Tables): a daemon keeps up to
#: ReaderPool.MAX_IDLE shards open besides those in use, each of up to a million values or
#: more; past it, a shard's random reads stay LMDB lookups.
TABLE_BYTES = 32 << 20
#: Shard files whose lookups a process counts towards a table at most (a few ints each).
TABLE_COUNTS = 1 << 16
#: Passes' worth of lookups of a shard file before its table is walked: the walk costs
#: about what this many passes of lookups lose against the table's slices, so no number of
#: passes spends more than twice the cheaper choice's (docs/design.md).
TABLE_AFTER_PASSES = 3


def _address(value: Any) -> int:
    """Where a buffer's first byte lies in this process's memory."""
    return int(np.frombuffer(value, np.uint8).__array_interface__["data"][0])


class _Offsets:
    """Where each value of a shard file lies, relative to the lowest-lying one (anchor), found
    by one cursor walk: a random read's value is then a slice of the map, ~0.2 us, against
    ~1.3 us for an LMDB lookup from Python (most of a shuffled read of 1 KB elements went
    there). Made only for a shard whose keys are exactly 0..n-1 (as ShardWriter writes
    them). The offsets are the file's, so they outlive the environment that found them: a
    later open of the same file binds them to its own map (_Values)."""

    def __init__(self, env: lmdb.Environment, n: int) -> None:
        at, sizes, i, pack = np.zeros(n, np.int64), np.zeros(n, np.int64), 0, _KEY.pack
        with env.begin(buffers=True) as txn, txn.cursor() as cur:
            for key, value in cur:
                if i >= n or key != pack(i):
                    raise ValueError("the shard's keys are not its value indices 0..n-1")
                if len(value):  # an empty one is refused where it is decoded
                    at[i] = _address(value)
                    sizes[i] = len(value)
                i += 1
        if i != n:
            raise ValueError("the shard's keys are not its value indices 0..n-1")
        filled = np.flatnonzero(sizes)
        if not filled.size:
            raise ValueError("the shard has no bytes to slice")
        at[sizes == 0] = at[filled].max()  # inside the span, zero bytes long
        #: the value at offset 0, and the one ending last: where a later map is checked
        self.anchor = int(filled[np.argmin(at[filled])])
        self.probe = int(filled[np.argmax((at + sizes)[filled])])
        self.starts = at - at[self.anchor]
        self.span = int((self.starts + sizes).max())
        # 8 bytes a value where all are one size (fixed-shape raw records), else 12
        same = bool((sizes == sizes[0]).all())
        self.lengths: int | np.ndarray = int(sizes[0]) if same else sizes.astype(np.int32)
        self.nbytes = self.starts.nbytes + (0 if same else n * 4)

    def length(self, index: int) -> int:
        return self.lengths if isinstance(self.lengths, int) else int(self.lengths[index])


class _Values:
    """A shard's _Offsets bound to one open environment's map; read only while that
    environment is open, as LMDB's own views are."""

    def __init__(self, offsets: _Offsets, env: lmdb.Environment) -> None:
        with env.begin(buffers=True) as txn:
            anchor, probe = txn.get(_KEY.pack(offsets.anchor)), txn.get(_KEY.pack(offsets.probe))
            if anchor is None or probe is None:
                raise ValueError("the shard's values are not where its table says")
            base = _address(anchor)
            if (
                len(anchor) != offsets.length(offsets.anchor)
                or len(probe) != offsets.length(offsets.probe)
                or _address(probe) - base != offsets.starts[offsets.probe]
            ):
                raise ValueError("the shard's values are not where its table says")
        self.starts, self.lengths = offsets.starts, offsets.lengths
        # read-only bytes over the map's span of values (LMDB maps the file PROT_READ)
        self.map = (
            memoryview((ctypes.c_char * offsets.span).from_address(base)).cast("B").toreadonly()
        )

    def get(self, indices: np.ndarray, views: bool) -> list[Any] | None:
        """The values at shard-local indices (views into the map, else copies); None when
        one is not in the shard."""
        if indices.size and not 0 <= int(indices.min()) <= int(indices.max()) < len(self.starts):
            return None
        starts = self.starts[indices]
        sizes = self.lengths if isinstance(self.lengths, int) else self.lengths[indices]
        ends = (starts + sizes).tolist()
        m = self.map
        if views:
            return [m[a:b] for a, b in zip(starts.tolist(), ends)]
        return [bytes(m[a:b]) for a, b in zip(starts.tolist(), ends)]


#: A shard file's identity: device, inode, size and modification time of its data.mdb. A
#: committed shard is never written again; a rebuilt one is another file.
Identity = tuple[int, int, int, int]


class _Count:
    """A shard file's lookups by index so far, and its table once they paid for one."""

    __slots__ = ("asked", "offsets", "refused", "reserved", "users", "walking")

    def __init__(self) -> None:
        self.asked = 0
        self.offsets: _Offsets | None = None
        self.reserved = 0  # of TABLE_BYTES
        self.refused = False  # keys of another kind: lookups, always
        self.walking = False
        self.users = 0  # open environments reading through the table


class _Tables:
    """The process's value tables, by shard file (Identity), kept across the environments
    that open the file: a pass of cc.numpy(), cc.torch() or tf.data opens its shards afresh,
    and each would otherwise walk again or never pay for a walk. At most TABLE_BYTES
    together; a table no open environment uses is dropped, least recently used first, to
    make room for another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.OrderedDict[Identity, _Count] = collections.OrderedDict()
        self.nbytes = 0

    def ask(self, identity: Identity, asked: int, n: int) -> _Offsets | bool:
        """Count asked lookups of the file of n values: its table (one more user), True when
        the caller is to walk it (room reserved: then done()), else False."""
        with self._lock:
            count = self._counts.get(identity)
            if count is None:
                if len(self._counts) >= TABLE_COUNTS:
                    self._drop_unused(lambda c: c.offsets is None)
                count = self._counts[identity] = _Count()
            self._counts.move_to_end(identity)
            if count.offsets is not None:
                count.users += 1
                return count.offsets
            count.asked += asked
            # TABLE_AFTER_PASSES passes' worth of lookups first: the walk costs several
            # lookups per value, so a few passes, or a few elements, never pay for it
            if count.refused or count.walking or count.asked - asked < TABLE_AFTER_PASSES * n:
                return False
            most = 12 * n  # the walk's result, at most
            while self.nbytes + most > TABLE_BYTES:
                if not self._drop_unused(lambda c: c.offsets is not None):
                    return False
            self.nbytes += most
            count.reserved, count.walking = most, True
            return True

    def done(self, identity: Identity, offsets: _Offsets | None, refused: bool = False) -> None:
        """After ask(): the walk's table (one more user), or None: the walk failed, its room
        given back; refused: the file has no table (keys of another kind, or values not
        where the table says)."""
        with self._lock:
            count = self._counts[identity]  # an entry walked or used is never dropped
            self.nbytes -= count.reserved
            count.reserved = offsets.nbytes if offsets is not None else 0
            self.nbytes += count.reserved
            count.offsets, count.walking = offsets, False
            count.users = count.users + 1 if offsets is not None else 0
            count.refused = count.refused or refused

    def release(self, identity: Identity) -> None:
        with self._lock:
            count = self._counts.get(identity)
            if count is not None and count.users:
                count.users -= 1

    def _drop_unused(self, which: Callable[[_Count], bool]) -> bool:
        """Drop the least recently used entry that no environment uses and which() picks;
        True if there was one."""
        for identity, count in self._counts.items():
            if not count.users and not count.walking and which(count):
                self.nbytes -= count.reserved
                del self._counts[identity]  # and out of the loop at once
                return True
        return False


_TABLES = _Tables()


class _Env:
    def __init__(self, path: Path) -> None:
        st = (path / "data.mdb").stat()
        self.inode = st.st_ino
        self.identity: Identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self.env = lmdb.open(
            str(path), readonly=True, lock=False, subdir=True, readahead=True, max_dbs=0
        )
        self.refs = 0
        # Reading a page past the end of a truncated file through mmap is SIGBUS,
        # which would kill the daemon: check the size LMDB expects up front.
        stat = self.env.stat()
        expected = (self.env.info()["last_pgno"] + 1) * stat["psize"]
        self.num_records = stat["entries"]
        self.file_bytes = expected
        self._values: _Values | None = None
        self._no_table = False
        self._table_lock = threading.Lock()
        if st.st_size < expected:
            self.env.close()
            raise lmdb.CorruptedError(
                f"data.mdb is {st.st_size} bytes, LMDB expects {expected} (truncated)"
            )

    def values(self, asked: int) -> _Values | None:
        """The table of where each value lies, bound to this map: once lookups by index of
        this shard file (in this environment or earlier ones of the process) have asked for
        TABLE_AFTER_PASSES times as many values as it holds, and while the process's tables
        fit in TABLE_BYTES (_Tables); else None."""
        if self._values is not None or self._no_table:
            return self._values
        if not self._table_lock.acquire(blocking=False):
            return None  # another thread walks or binds it meanwhile: look these up
        try:
            if self._values is not None or self._no_table:
                return self._values
            got = _TABLES.ask(self.identity, asked, self.num_records)
            if got is False:
                return None
            offsets = None
            try:
                if got is True:
                    offsets = _Offsets(self.env, self.num_records)
                    _TABLES.done(self.identity, offsets)
                else:
                    offsets = got
                self._values = _Values(offsets, self.env)
            except ValueError:
                self._no_table = True  # keys of another kind: lookups, as before
                _TABLES.done(self.identity, None, refused=True)
            except BaseException:
                if offsets is None:  # the walk failed: its room back, a later one may walk
                    _TABLES.done(self.identity, None)
                else:
                    _TABLES.release(self.identity)
                raise
        finally:
            self._table_lock.release()
        return self._values

    def close(self) -> None:
        with self._table_lock:
            if self._values is not None:
                _TABLES.release(self.identity)
            self._values, self._no_table = None, True
        self.env.close()


def _same_file(path: Path, ent: _Env) -> bool:
    """True while path's data.mdb is still the file ent maps (not deleted, not rebuilt)."""
    try:
        return (path / "data.mdb").stat().st_ino == ent.inode
    except FileNotFoundError:
        return False


class ReaderPool:
    """Shares one read-only environment per committed shard across streams.

    LMDB allows one open of an environment per process; committed shards are
    immutable, so readers need no lock file and no writer coordination.
    """

    #: Environments kept open with no stream on them, most recently used last.
    MAX_IDLE = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._envs: dict[Path, _Env] = {}
        self._idle: collections.OrderedDict[Path, _Env] = collections.OrderedDict()

    def _acquire(self, path: Path) -> _Env:
        """The open environment of the shard now at path (a rebuilt cache gets a new one)."""
        with self._lock:
            try:
                ent = self._envs.get(path)
                if ent is None or ent.inode != (path / "data.mdb").stat().st_ino:
                    if ent is not None and ent.refs == 0:
                        self._close(path, ent)
                    ent = self._envs[path] = _Env(path)
            except (lmdb.Error, OSError) as exc:
                raise DataLoss(
                    f"cannot open shard {path}: {exc}; delete the cache and build it again"
                ) from exc
            ent.refs += 1
            self._idle.pop(path, None)
            return ent

    def hold(self, path: Path) -> _Env:
        """Open the shard at path and keep it open until release(path, env).

        The files stay mapped however the shard changes meanwhile: a direct
        reader's snapshot (client/read/fetching/direct.py). Raises DataLoss for a damaged shard.
        """
        return self._acquire(path)

    def release(self, path: Path, ent: _Env) -> None:
        self._release(path, ent)

    def retain(self, ent: _Env) -> _Env:
        """One more hold on an environment already held (release(path, env) it as well)."""
        return self._retain(ent)

    def _retain(self, ent: _Env) -> _Env:
        with self._lock:
            ent.refs += 1
            return ent

    def _release(self, path: Path, ent: _Env) -> None:
        """A stream is done with ent. It stays open while idle (a reader's next request
        would otherwise map the file again and page-fault it all in afresh), up to
        MAX_IDLE shards, until forget() or a rebuilt shard replaces it."""
        with self._lock:
            ent.refs -= 1
            if ent.refs:
                return
            if self._envs.get(path) is not ent or not _same_file(path, ent):
                self._close(path, ent)  # rebuilt or deleted meanwhile
                return
            self._idle[path] = ent
            while len(self._idle) > self.MAX_IDLE:
                self._close(*self._idle.popitem(last=False))

    def _close(self, path: Path, ent: _Env) -> None:
        """Call with the lock held, for an env without streams."""
        if self._idle.get(path) is ent:
            del self._idle[path]
        if self._envs.get(path) is ent:
            del self._envs[path]
        ent.close()

    def forget(self, directory: Path) -> None:
        """Close the idle environments of shards under directory (it is being deleted: its
        files' space is released once no stream maps them)."""
        with self._lock:
            for path, ent in list(self._idle.items()):
                if path.is_relative_to(directory):
                    self._close(path, ent)

    def read_chunks(
        self,
        path: Path,
        start: int,
        stop: int,
        chunk_bytes: int,
        block_elements: int = 1,
        held: _Env | None = None,
        views: bool = False,
        join: Callable[[int, bytes, list[Any]], Any] | None = None,
        ahead: ReadAhead | None = None,
        aheads: ReadAheads | None = None,
    ) -> Iterator[tuple[int, bytes, Any]]:
        """Yield (first element, u32 lengths, data) for the values holding elements
        [start, stop), k = block_elements per value: whole blocks, so the first chunk
        may start before start and the last end after stop (the client trims).

        Each chunk is read in its own short transaction, so a slow consumer never
        pins an old snapshot. held: an environment from hold(), read even if the
        shard was deleted or rebuilt since. views: with held, yield each chunk's data as
        the list of its values' memoryviews into the map instead of one joined copy; they
        stay valid until held is released (a direct reader's pass, client/read/fetching/direct.py).
        join: instead of joining a chunk's values, data = join(first, lengths, views of
        the values), called while the views are valid (the daemon frames its ReadShard
        response there: client/wire/chunks.py). ahead: the shard's read-ahead, shared
        by the reads of one pass (read_ahead(); not closed here); aheads: a reader's
        read-aheads, the shard's taken from there (and left open); else one of this read's.
        """
        k = block_elements
        start, stop = start // k, -(-stop // k)  # the values holding them
        ent = self._acquire(path) if held is None else self._retain(held)
        if ahead is None and aheads is not None:
            ahead = aheads.get(path, ent, ent.file_bytes, ent.num_records)
        own = ahead is None
        if ahead is None:
            ahead = ReadAhead(path, ent.file_bytes, ent.num_records, stop)
        try:
            index = start
            while index < stop:
                ahead.at(index)
                try:
                    first, lengths, data = index, [], []
                    size = 0
                    with ent.env.begin(buffers=True) as txn, txn.cursor() as cur:
                        if not cur.set_key(_KEY.pack(index)):
                            raise DataLoss(f"shard {path} is missing record {index}; {_REBUILD}")
                        for key, value in cur:
                            if index >= stop:
                                break
                            if bytes(key) != _KEY.pack(index):
                                raise DataLoss(
                                    f"shard {path}: record {index} is missing; {_REBUILD}"
                                )
                            lengths.append(len(value))
                            data.append(value)
                            size += len(value)
                            index += 1
                            if size >= chunk_bytes:
                                break
                        packed = struct.pack(f"<{len(lengths)}I", *lengths)
                        blob: Any
                        if join is not None:
                            blob = join(first * k, packed, data)
                        else:
                            blob = data if views and held is not None else b"".join(data)
                except lmdb.Error as exc:
                    raise _translate(exc, path) from exc
                yield first * k, packed, blob
        finally:
            if own:
                ahead.close()
            self._release(path, ent)

    @staticmethod
    def read_ahead(path: Path, held: _Env) -> ReadAhead:
        """A read-ahead over a held shard for all the reads of one pass (close() it)."""
        return ReadAhead(path, held.file_bytes, held.num_records)

    @contextlib.contextmanager
    def opened(self, path: Path) -> Iterator[ShardGetter]:
        """The shard at path, open for random reads while the context lasts."""
        ent = self._acquire(path)
        try:
            yield ShardGetter(ent, path)
        finally:
            self._release(path, ent)


class ShardGetter:
    """Random reads from one open shard, by shard-local index."""

    def __init__(self, ent: _Env, path: Path) -> None:
        self._ent = ent
        self._env = ent.env
        self._path = path

    def get_many(self, keys: bytes, views: bool = False) -> list[Any]:
        """The records at the big-endian u64 keys packed in keys, in one short transaction
        (or sliced from the map by a table of where each lies, _Values). views: as
        memoryviews into the map, valid while the environment stays open (a held shard:
        ReaderPool.hold), instead of copies."""
        table = self._ent.values(len(keys) // _KEY.size)
        if table is not None:
            got = table.get(np.frombuffer(keys, ">u8").astype(np.int64), views)
            if got is not None:
                return got
        try:
            with self._env.begin(buffers=views) as txn:  # type: ignore[call-overload]
                get = txn.get
                values = [get(keys[i : i + 8]) for i in range(0, len(keys), 8)]
        except lmdb.Error as exc:
            raise _translate(exc, self._path) from exc
        if None in values:
            missing = _KEY.unpack_from(keys, 8 * values.index(None))[0]
            raise DataLoss(f"shard {self._path} is missing record {missing}; {_REBUILD}")
        return values  # type: ignore[return-value]
