"""Same-host direct reads: the client reads committed shard files itself.

When the training process runs on the daemon's host (a pod sidecar, a
standalone daemon on the training node), streaming records over gRPC costs
CPU on both sides for bytes that already sit in the local page cache. Instead,
each pass over an epoch takes a *read lease* from the daemon
(AcquireReadLease): the daemon answers with its data dir, the cache's shard
directories and its instance token. The client reads the token file back
through the path it would read the shards from; the same token proves the same
host and the same view of the files. Then it opens every shard read-only
(client/format/store.py: LMDB without a lock file, mmap, the size check against
truncation) and reads them with the daemon's own functions: ReaderPool.read_chunks
for runs of stored order (same chunks, same read-ahead as ReadShard) and
client/format/lookup.py for any other order (as ReadElements). The chunks go to
the same decoder as the gRPC path, so order, shuffle, worker shares and resume
are identical. A background thread renews the lease every third of its TTL;
the pass releases it at its end.

All shards are opened when the lease is taken and stay open until the pass
ends, so the pass reads one snapshot: a cache deleted (or deleted and rebuilt)
meanwhile keeps serving the files that were mapped. A cache of more shards than
the process may hold open is opened as the pass goes instead, a bounded set at a
time (client/read/fetching/open_shards.py). If renewing fails (the
daemon died, or the lease expired), the pass still finishes from those files,
logs one warning and stops renewing. docs/direct.md has the decisions.

A partially resident cache's streamed shards (not on the daemon's disk) are read from
the daemon's stream window's files, each held for the runs that read it
(client/read/fetching/held.py).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from client import settings
from client._transport import Transport, pb
from client.errors import (
    DataLossError,
    DirectReadUnavailableError,
    InvalidArgumentError,
    ShardcacheError,
)
from client.format.layout import Layout
from client.read.fetching import lease as read_lease
from client.read.fetching.fetch import Closed, is_run, shard_runs
from client.read.fetching.held import Holds, read_held
from client.read.fetching.open_shards import OpenShards
from client.wire.limits import DEFAULT_CHUNK_BYTES
from client.wire.status import DataLoss

log = logging.getLogger("client")
_POOL: Any = None  # client.format.store.ReaderPool, made on first use (imports lmdb)
_POOL_LOCK = threading.Lock()
Mode = bool | str
#: Shards of one pass with a read-ahead (a thread and a file descriptor each) at a time.
READ_AHEADS = 32


def resolve_mode(direct: Mode | None) -> Mode:
    """direct= as given, else $SHARDCACHE_DIRECT, else "auto"; checked."""
    if direct is None:
        return settings.DIRECT.get()
    if direct is True or direct is False or direct == "auto":
        return direct
    raise InvalidArgumentError(f"direct must be 'auto', True or False, got {direct!r}")


def resolve_local_data_dir(local_data_dir: str | Path | None) -> Path | None:
    value = local_data_dir or settings.LOCAL_DATA_DIR.get()
    return Path(value) if value is not None else None


def _pool() -> Any:
    global _POOL
    if _POOL is not None:  # no lock per read: Grain's 16 threads each read one element
        return _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from client.format.store import ReaderPool

            _POOL = ReaderPool()  # one open per shard per process, shared by every pass
            # Nothing stays mapped between passes: an idle map of a cache the daemon evicts
            # later would keep its unlinked files' disk space from being freed.
            _POOL.MAX_IDLE = 0
        return _POOL


class DirectReads:
    """How one dataset's passes read: take a lease and read locally, or say why not."""

    def __init__(
        self, transport: Transport, mode: Mode, local_data_dir: Path | None, quiet: bool = False
    ) -> None:
        self.mode = mode
        self._transport = transport
        self._local = local_data_dir
        self._verified = False
        self._quiet = quiet
        self._members: dict[str, DirectReads] = {}
        #: Why streamed shards are read through the daemon, not from its window's files
        #: ("": they are read here; client/read/fetching/held.py).
        self.holds_off = ""

    def member(self, transport: Transport) -> DirectReads:
        """The DirectReads of a fleet's member (client/_fleet.py): "auto", and quiet when the
        member is on another host, as most are."""
        reads = self._members.get(transport.target)
        if reads is None:
            reads = self._members[transport.target] = DirectReads(
                transport, "auto", self._local, quiet=True
            )
        return reads

    def check(self, cache: pb.Cache) -> None:
        """With direct=True, raise DirectReadUnavailableError now (not mid-iteration, where
        tf.data would wrap it) when this process cannot read cache's files."""
        if self.mode is True:
            self._verify(cache)

    def _verify(self, cache: pb.Cache, shards: Sequence[int] = ()) -> bool:
        """Prove once that this process sees the daemon's files, with a lease that counts
        nothing and ends at once; False (after _refuse) when it does not. shards: the ones
        to be read (a daemon pulling the cache fetches them first; empty: all)."""
        if self._verified:
            return True
        lease = self._acquire(cache, False, shards)
        if lease is None:
            return False
        why, _ = local_view(lease.granted, self._local, shards)
        lease.release()
        if why:
            self._refuse(why)
            return False
        self._verified = True
        return True

    def _acquire(
        self,
        cache: pb.Cache,
        epoch_start: bool,
        shards: Sequence[int],
        pass_shards: Sequence[int] = (),
    ) -> read_lease.Lease | None:
        try:
            return read_lease.acquire(
                self._transport,
                cache,
                epoch_start=epoch_start,
                shards=shards,
                pass_shards=pass_shards,
            )
        except read_lease.NotGranted as exc:
            self._refuse(str(exc))
            return None

    def fetcher(
        self,
        cache: pb.Cache,
        shards: Sequence[int] | None = None,
        epoch_start: bool = True,
        pass_shards: Sequence[int] = (),
    ) -> tuple[LocalFetcher | None, bool]:
        """(a fetcher of cache's leased shard files for one pass, or None: read remotely;
        whether the daemon counted the pass's hit already). shards: only these are opened
        (None: all); pass_shards: the pass's shards in its order, for the daemon."""
        if self.mode is False or not self._verify(cache, shards or ()):
            return None, False
        lease = self._acquire(cache, epoch_start, shards or (), pass_shards)
        if lease is None:
            return None, False
        why, paths = local_view(lease.granted, self._local, shards or ())
        if why:  # unmounted since it was verified; the lease counted the pass's hit
            lease.release()
            self._refuse(why)
            return None, epoch_start
        streamed = set(lease.granted.streamed_shards)  # read through the daemon
        try:
            wanted = range(len(paths)) if shards is None else shards
            held = OpenShards(_pool(), paths, [s for s in wanted if s not in streamed], cache.name)
        except DataLoss as exc:
            lease.release()
            raise DataLossError(f"cache {cache.name!r}: {exc}") from exc
        lease.renew_in_background(
            "this pass finishes from the shard files it holds open, "
            "the daemon may evict the cache meanwhile"
        )
        streamed &= set(range(len(paths)))
        holds = None
        if streamed and not self.holds_off:
            local = self._local

            def here(path: str) -> Path:
                return local_path(lease.granted, local, path)

            holds = Holds(lease, here, _pool(), self._no_holds)
        return LocalFetcher(lease, paths, held, streamed, holds), epoch_start

    def _no_holds(self, why: str) -> None:
        """Streamed shards are read through the daemon from now on: said once."""
        if not self.holds_off:
            self.holds_off = why
            log.log(
                logging.DEBUG if self._quiet else logging.INFO,
                "reading the streamed shards of partially resident caches through the "
                "daemon, not from its files: %s",
                why,
            )

    def _refuse(self, why: str) -> None:
        if self.mode is True:
            raise DirectReadUnavailableError(
                f"direct=True, but this process cannot read the daemon's files: {why}; pass "
                "direct='auto' (or False) to read over gRPC"
            )
        self.mode = False  # the host does not change: later passes go straight to gRPC
        log.log(
            logging.DEBUG if self._quiet else logging.INFO,
            "reading %sover gRPC, not directly: %s",
            f"from {self._transport.target} " if self._quiet else "",
            why,
        )


def local_path(
    granted: pb.AcquireReadLeaseResponse, local_data_dir: Path | None, path: str
) -> Path:
    """A path the daemon named under its data dir, as this process sees it."""
    daemon_dir = Path(granted.data_dir)
    return (local_data_dir or daemon_dir) / Path(path).relative_to(daemon_dir)


def local_view(
    granted: pb.AcquireReadLeaseResponse, local_data_dir: Path | None, shards: Sequence[int] = ()
) -> tuple[str, list[Path]]:
    """("", shard dirs as seen here), or (why they cannot be read here, []); shards: the
    ones to be read, checked (empty: all)."""
    daemon_dir = Path(granted.data_dir)
    where = (
        f"the daemon's data dir {daemon_dir}"
        if local_data_dir is None
        else f"local_data_dir {local_data_dir} (the daemon's {daemon_dir})"
    )
    hint = (
        "run on the daemon's host, or mount its data dir here and pass local_data_dir= "
        f"(${settings.LOCAL_DATA_DIR.name}) naming where"
    )

    def here(path: str) -> Path:
        return local_path(granted, local_data_dir, path)

    token_path = here(granted.instance_token_path)
    try:
        token = token_path.read_text().strip()
    except FileNotFoundError:
        return f"{token_path} does not exist: {where} is not visible here ({hint})", []
    except PermissionError:
        return (
            f"cannot read {token_path}: permission denied; run as a user or group that "
            "may read the daemon's data dir"
        ), []
    except OSError as exc:
        return f"cannot read {token_path}: {exc.strerror}", []
    if token != granted.instance_token:
        return (
            f"{token_path} belongs to another daemon: {where} here is not the files that "
            f"daemon serves ({hint})"
        ), []
    paths = [here(d) for d in granted.shard_dirs]
    streamed = set(granted.streamed_shards)  # not on the daemon's disk: read through it
    for path in [paths[s] for s in shards or range(len(paths)) if s not in streamed]:
        if not os.access(path / "data.mdb", os.R_OK):
            return (
                f"cannot read {path / 'data.mdb'}: permission denied; run as a user or "
                "group that may read the daemon's data dir"
            ), []
    return "", paths


class LocalFetcher:
    """A Fetcher of one pass's leased shard files: chunks of records by index, as gRPC's
    (position in the request, u32 lengths, data), read here. close() ends the pass."""

    path = "direct"

    def __init__(
        self,
        lease: read_lease.Lease,
        paths: list[Path],
        held: OpenShards,
        streamed: set[int] | None = None,
        holds: Holds | None = None,
    ) -> None:
        self.lease = self._lease = lease
        #: Shards the daemon streams from the object store (not held here): a
        #: PartialFetcher reads them from the daemon's window's files under holds, or
        #: sends their reads to the daemon (client/read/fetching/partial.py).
        self.streamed = streamed or set()
        self.window_holds = holds
        self._cache = cache = lease.cache
        self.paths = paths
        self._held = held
        self._closing = threading.Event()
        self._firsts = np.array([s.first_element for s in cache.shards], np.uint64)
        layout = Layout.from_json(cache.layout_json)
        self._k = layout.block_elements
        # values as views into the held map, no joined copy: decode_into and decode_batch
        # copy fixed-shape numeric values out into fresh arrays before the pass ends and the
        # map goes (docs/design.md); other layouts' arrays may be views of their values. A
        # pass opening its shards as it goes may close a map before then: copies.
        self._views = layout.fixed_numeric and not held.lazy
        self.chunk_bytes = DEFAULT_CHUNK_BYTES  # of records per chunk
        self._lock = threading.Lock()
        # per shard, for every read of the pass, least recently used first
        self._ahead: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._released = False
        self._cause = ""

    def holds(self, shard: int) -> bool:
        return self._held.holds(shard)

    def failed(self, cause: ShardcacheError) -> None:
        self._cause = self._cause or str(cause)  # the maps stay: other chunks may read them

    def close(self) -> None:
        """Stop the read-aheads, close the shards, end the lease on the daemon."""
        self._closing.set()
        with self._lock:
            aheads, self._ahead = list(self._ahead.values()), collections.OrderedDict()
        for ahead in aheads:
            ahead.close()
        with self._lock:
            released, self._released = self._released, True
        if not released:
            self._held.close()
            if self.window_holds is not None:
                self.window_holds.close()  # maps closed, then holds released, then the lease
        self._lease.release()

    def _read_ahead(self, shard: int, env: Any) -> Any:
        """The shard's read-ahead: one thread per shard and pass, however many reads
        (chunked reads ask for a few MiB at a time, client/read/assembly/chunks.py); the
        least recently used closed past READ_AHEADS shards (a thread and a file each)."""
        with self._lock:
            ahead = self._ahead.get(shard)
            if ahead is not None:
                self._ahead.move_to_end(shard)
                return ahead
            if self._closing.is_set():
                return None
            ahead = self._ahead[shard] = _pool().read_ahead(self.paths[shard], env)
            while len(self._ahead) > READ_AHEADS:
                self._ahead.popitem(last=False)[1].close()  # a reader of it reads on without
            return ahead

    def stream(self, indices: Any, epoch_start: bool = False, land: Any = None) -> Iterator[Any]:
        """epoch_start is the lease's business here (counted when it was granted); land:
        unused (the values are read from the shard's map, the decoder copies them once)."""
        chunks = self._chunks(indices)
        try:
            for chunk in chunks:
                if self._closing.is_set():
                    raise Closed(self._cache.name, self._cause)
                yield chunk
        except DataLoss as exc:  # the daemon's own words, as ReadShard would send them
            raise DataLossError(str(exc)) from exc
        finally:
            chunks.close()  # ends the shard cursor now, not when collected

    def _chunks(self, indices: Any) -> Generator[Any, None, None]:
        if not len(indices):
            return
        first = int(indices[0])
        if not is_run(indices):
            yield from self.gather(indices)
            return
        pool = _pool()
        for shard, start, count in shard_runs(self._cache, first, first + len(indices)):
            offset = shard.first_element - first
            with self._held.using(shard.index) as env:
                for local, lengths, data in pool.read_chunks(
                    self.paths[shard.index],
                    start,
                    start + count,
                    self.chunk_bytes,
                    block_elements=self._k,
                    held=env,
                    views=self._views,
                    ahead=self._read_ahead(shard.index, env),
                ):
                    yield offset + local, lengths, data

    @contextlib.contextmanager
    def streamed_run(self, shard: int, indices: Any) -> Iterator[Iterator[Any] | None]:
        """The chunks of indices, all in streamed shard, read from the daemon's window's
        files under a hold while the block lasts; None: read them through the daemon."""
        info = self._cache.shards[shard]
        last = info.first_element + info.num_elements - 1
        to_end = bool(len(indices)) and int(np.max(indices)) == last
        with (
            contextlib.nullcontext(None)
            if self.window_holds is None
            else self.window_holds.using(shard, to_end)
        ) as held:
            if held is None:
                yield None
                return
            chunks = read_held(
                held, indices, self._cache, self._firsts, self.chunk_bytes, self._k, _pool()
            )
            try:
                yield self._checked(chunks)
            finally:
                chunks.close()

    def _checked(self, chunks: Iterator[Any]) -> Iterator[Any]:
        """chunks, ending with Closed once the pass closes, DataLossError for a bad file."""
        try:
            for chunk in chunks:
                if self._closing.is_set():
                    raise Closed(self._cache.name, self._cause)
                yield chunk
        except DataLoss as exc:
            raise DataLossError(str(exc)) from exc

    def gather(self, indices: np.ndarray) -> Iterator[Any]:
        """The records at indices, one element per value, as ReadElements sends them."""
        from client.format.lookup import gather_chunks, window_records

        # views cost no join: the whole request is one chunk, decoded into one array per
        # leaf (a batch of 64 602 KB images was 10 chunks, then joined: one more copy)
        window = (
            len(indices)
            if self._views
            else window_records(
                self.chunk_bytes, self._cache.num_elements, self._cache.stored_bytes
            )
        )
        try:
            yield from gather_chunks(
                self._getter,
                indices.astype(np.uint64),
                self._firsts,
                window,
                self._cache.layout_json,
                f"cache {self._cache.name!r}",
                self._views,
            )
        except DataLoss as exc:
            raise DataLossError(str(exc)) from exc

    @contextlib.contextmanager
    def _getter(self, shard: int) -> Iterator[Any]:
        from client.format.store import ShardGetter

        with self._held.using(shard) as env:
            yield ShardGetter(env, self.paths[shard])
