"""A same-host pass's streamed shards, read from the daemon's stream window's files.

A cache larger than the daemon's room keeps some shards on its disk and streams the
others from the object store for each pass, one shard at a time into a few window slots
(docs/operations.md, "Caches larger than the room"). Sending a streamed shard's records
on to a reader on the same host cost the daemon more CPU than fetching it (its SHA-256,
the slot's file, then every byte again over gRPC or the data plane), so a same-host
reader reads the slot's file itself, as it reads resident shards: for each run of a
request in a streamed shard it *holds* the shard (HoldStreamedShard: the daemon answers
once the slot is fetched and checked, and keeps it while held), maps the slot's file
read-only through the process's ReaderPool, reads the run, closes the map and releases
the hold (ReleaseStreamedShard, read_to_end once the run reached the shard's last
element). The map is closed before the release, so the daemon's deletion of the slot
frees its disk at once.

Runs of one pass in the same shard at once share one hold. Past ``MAX_HOLDS`` shards held
at once (the daemon's bound for one lease), or when the daemon is busy taking holds, a
run is read through the daemon instead; nothing here waits for another run to finish, so
readers that hold a run's chunks while asking for the next cannot deadlock on it. When
the daemon has no such call (an older one) or its slot files cannot be read here, the
pass reads its streamed shards through the daemon, logged once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from client._transport import pb
from client.errors import (
    DataLossError,
    InvalidArgumentError,
    LeaseNotFoundError,
    ShardcacheError,
    TooManyHoldsError,
)
from client.read.fetching import lease as read_lease
from client.read.fetching.fetch import is_run
from client.wire.status import DataLoss

log = logging.getLogger("client")

#: Streamed shards one pass holds at once (the daemon's bound for one lease:
#: cacheserver/catalog/leases.py MAX_HOLDS).
MAX_HOLDS = 2


@dataclass
class Held:
    """One streamed shard's files, open here while runs read them."""

    shard: int
    path: Path
    env: Any  # client.format.store's held environment
    resident: bool  # the daemon's own copy: no hold to release
    users: int = 1
    read_to_end: bool = False


class Holds:
    """The holds of one pass's streamed shards (one lease): using(shard) opens its files,
    held on the daemon while any run of the pass reads them."""

    def __init__(
        self,
        lease: read_lease.Lease,
        here: Callable[[str], Path],
        pool: Any,
        refused: Callable[[str], None],
    ) -> None:
        self._lease = lease
        self._here = here  # the daemon's path of a directory -> the path here
        self._pool = pool
        self._refused = refused  # holds are off for this reader from now on, and why
        self._cond = threading.Condition()
        self._held: dict[int, Held] = {}
        self._taking: set[int] = set()
        self._resident: dict[int, Path] = {}  # streamed at the lease, on its disk since
        self.off = ""  # why this pass reads its streamed shards through the daemon

    @contextlib.contextmanager
    def using(self, shard: int, to_end: bool) -> Iterator[Held | None]:
        """The shard's files, open and held while the block lasts; None: read it through
        the daemon (too many held now, or holds are off). to_end: the block reads the shard
        to its last element (once it did without an error, the daemon drops it first)."""
        held = self._enter(shard)
        if held is None:
            yield None
            return
        ok = False
        try:
            yield held
            ok = True
        finally:
            self._leave(held, ok and to_end)

    def close(self) -> None:
        """Close every map and release every hold (the pass ends)."""
        with self._cond:
            held, self._held = list(self._held.values()), {}
            self.off = self.off or "the pass ended"
        for h in held:
            self._let_go(h)

    def _enter(self, shard: int) -> Held | None:
        with self._cond:
            while True:
                if self.off:
                    return None
                held = self._held.get(shard)
                if held is not None:
                    held.users += 1
                    return held
                if shard in self._taking:  # another run is holding it: its RPC returns
                    self._cond.wait()
                    continue
                if len(self._held) + len(self._taking) >= MAX_HOLDS:
                    return None
                self._taking.add(shard)
                break
        held = None
        try:
            held = self._take(shard)
        finally:
            with self._cond:
                self._taking.discard(shard)
                if held is not None:
                    self._held[shard] = held
                self._cond.notify_all()
        return held

    def _take(self, shard: int) -> Held | None:
        """Hold shard on the daemon and open its files; None: read it through the daemon."""
        name = self._lease.cache.name
        path = self._resident.get(shard)
        resident = path is not None
        if path is None:
            try:
                answer = self._lease.transport.call(
                    self._lease.transport.stub.HoldStreamedShard,
                    pb.HoldStreamedShardRequest(lease_id=self._lease.granted.lease_id, shard=shard),
                )
            except TooManyHoldsError:
                return None  # the daemon is busy: this run through it
            except (DataLossError, InvalidArgumentError):
                raise  # as a read through the daemon would
            except ShardcacheError as exc:
                self._off(
                    "the daemon does not serve its stream window's files "
                    f"(HoldStreamedShard: {exc})"
                    if type(exc) is ShardcacheError  # UNIMPLEMENTED: an older daemon
                    else "the lease ended"
                    if isinstance(exc, LeaseNotFoundError)
                    else f"holding shard {shard} failed ({exc})",
                    forever=type(exc) is ShardcacheError,
                )
                return None
            path, resident = self._here(answer.shard_dir), answer.resident
            if resident:
                self._resident[shard] = path
        try:
            if not os.access(path / "data.mdb", os.R_OK):
                raise DataLoss(f"cannot read {path / 'data.mdb'}: permission denied")
            env = self._pool.hold(path)
        except (DataLoss, OSError, ValueError) as exc:
            if not resident:
                self._release(shard, False)
            self._off(
                f"cache {name!r}: its stream window's file {path / 'data.mdb'} cannot be read "
                f"here ({exc}); run as a user or group that may read the daemon's data dir",
                forever=True,
            )
            return None
        return Held(shard, path, env, resident)

    def _leave(self, held: Held, read_to_end: bool) -> None:
        with self._cond:
            held.users -= 1
            held.read_to_end = held.read_to_end or read_to_end
            if held.users or self._held.get(held.shard) is not held:
                return
            del self._held[held.shard]
        self._let_go(held)

    def _let_go(self, held: Held) -> None:
        """Close the map first (the daemon deletes the slot's file once released), then end
        the hold."""
        self._pool.release(held.path, held.env)
        if not held.resident:
            self._release(held.shard, held.read_to_end)

    def _release(self, shard: int, read_to_end: bool) -> None:
        try:
            self._lease.transport.call(
                self._lease.transport.stub.ReleaseStreamedShard,
                pb.ReleaseStreamedShardRequest(
                    lease_id=self._lease.granted.lease_id, shard=shard, read_to_end=read_to_end
                ),
                timeout=5,
            )
        except (ShardcacheError, ValueError) as exc:  # ValueError: the client was closed
            log.debug("could not release streamed shard %d (the lease ends it): %s", shard, exc)

    def _off(self, why: str, forever: bool) -> None:
        """Read the streamed shards of this pass (forever: of every pass) through the daemon."""
        with self._cond:
            if self.off:
                return
            self.off = why
        if forever:
            self._refused(why)
        else:
            log.info(
                "cache %r: reading its streamed shards through the daemon for the rest of "
                "this pass: %s",
                self._lease.cache.name,
                why,
            )


def read_held(
    held: Held,
    indices: Any,
    cache: pb.Cache,
    firsts: np.ndarray,
    chunk_bytes: int,
    block_elements: int,
    pool: Any,
) -> Generator[Any, None, None]:
    """The chunks of indices, all in held's shard, as a LocalFetcher reads them (a run of
    stored order in chunks, any other order by lookup): copies, never views, since the map
    closes when the hold ends, maybe before the decoder is done with them."""
    if not len(indices):
        return
    if not is_run(indices):
        from client.format.lookup import gather_chunks, window_records
        from client.format.store import ShardGetter

        @contextlib.contextmanager
        def getter(shard: int) -> Iterator[Any]:
            yield ShardGetter(held.env, held.path)

        window = window_records(chunk_bytes, cache.num_elements, cache.stored_bytes)
        yield from gather_chunks(
            getter,
            np.asarray(indices).astype(np.uint64),
            firsts,
            window,
            cache.layout_json,
            f"cache {cache.name!r}",
            False,
        )
        return
    first = int(indices[0])
    shard = cache.shards[held.shard]
    start = first - shard.first_element
    offset = shard.first_element - first
    for local, lengths, data in pool.read_chunks(
        held.path,
        start,
        start + len(indices),
        chunk_bytes,
        block_elements=block_elements,
        held=held.env,
    ):
        yield offset + local, lengths, data
