"""Same-host writes: the client writes the shard files itself, the daemon commits them.

The write side of docs/direct.md. Streaming a write-through epoch to the daemon
costs the daemon ~3.3 CPU s per GB (gRPC's receive path in Python, the copy
into LMDB, the page cache; docs/writing.md), on the same cores as the pipeline.
When the client runs on the daemon's host, :class:`LocalWriter` asks for a
local write in its WriteBegin; the daemon answers with a staging directory
(inside the cache's directory) and its instance token. The client proves it
sees the daemon's files (the token, read through the path it will write to,
client/read/fetching/direct.py's ``local_view``) and writes the shards there with the
store's own ShardWriter (client/format/store.py: the same LMDB layout, fsync at
each shard's end). finish() sends one WriteFinish naming the shards and their
counts; the daemon checks them (cacheserver/catalog/direct_writes.py) and commits.

The WriteCache stream stays the lease: cancelling it (abort(), a client killed
with kill -9) makes the daemon delete the staging directory with the cache,
and a restarted daemon removes it with any unfinished cache. A staging
directory this process cannot write (a read-only mount, another host) falls
back to streaming chunks on the same stream under direct="auto" and raises
DirectWriteUnavailableError under direct=True. A failure of the local write
itself (a full disk) is reported to the daemon, which logs it and discards the
write; the epoch goes on from the source as for a streamed write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from client._transport import Transport, pb
from client.errors import (
    DataLossError,
    DirectWriteUnavailableError,
    DiskFullError,
    ShardcacheError,
)
from client.read.fetching import direct as direct_read
from client.wire.limits import DEFAULT_CHUNK_BYTES
from client.wire.status import DataLoss, DiskFull
from client.write.stream import CacheWriter

log = logging.getLogger("client")


def writer_for(
    transport: Transport, begin: pb.WriteBegin, direct: Any, local_data_dir: Path | None
) -> CacheWriter:
    """The writer of a write-through epoch: local unless direct (a DirectReads) is off."""
    mode = getattr(direct, "mode", False)
    if mode is False:
        return CacheWriter(transport, begin)
    return LocalWriter(transport, begin, mode, local_data_dir)


def _translate(exc: Exception) -> ShardcacheError:
    """The store's errors (client.wire.status) as the client's."""
    if isinstance(exc, DiskFull):
        return DiskFullError(str(exc))
    if isinstance(exc, DataLoss):
        return DataLossError(str(exc))
    return ShardcacheError(f"writing the cache's files here failed: {exc}")


class LocalWriter(CacheWriter):
    """A CacheWriter that writes the shard files itself when the daemon's files are here.

    Same interface and thread use as CacheWriter (WriteBehind calls add() from
    its thread; abort() may come from another thread at any time).
    """

    def __init__(
        self,
        transport: Transport,
        begin: pb.WriteBegin,
        mode: bool | str,
        local_data_dir: Path | None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        local = pb.WriteBegin()
        local.CopyFrom(begin)
        local.local = True
        super().__init__(transport, local, chunk_bytes)
        self._mode = mode
        self._base = local_data_dir
        self._staging: Path | None = None  # None: streaming chunks (CacheWriter's way)
        self._shard_bytes = 0
        self._shard: Any = None  # client.format.store.ShardWriter being written
        self._staged: list[pb.StagedShard] = []
        self._lock = threading.Lock()  # add() and abort() never touch the files at once
        self._aborted = False
        self._pending_elements = 0  # elements in the values held for the next transaction

    @property
    def local(self) -> bool:
        """True while the shard files are written here rather than streamed."""
        return self._staging is not None

    def begin(self) -> pb.WriteBegun:
        begun = super().begin()
        if begun.decision != pb.WRITE_DECISION_ACCEPTED:
            return begun
        why = self._open(begun)
        if why:
            if self._mode is True:
                self.abort()
                raise DirectWriteUnavailableError(
                    f"direct=True, but this process cannot write the cache's files on the "
                    f"daemon's host: {why}; pass direct='auto' (or False) to send them over "
                    "gRPC"
                )
            log.info("writing cache %r over gRPC, not directly: %s", begun.cache.name, why)
        return begun

    def _open(self, begun: pb.WriteBegun) -> str:
        """Prove the staging directory is the daemon's and writable here: "" or why not."""
        if not begun.local_dir:
            return "the daemon does not offer same-host writes (an older cacheserver)"
        data_dir = Path(begun.data_dir)
        granted = pb.AcquireReadLeaseResponse(
            data_dir=begun.data_dir,
            instance_token=begun.instance_token,
            instance_token_path=str(data_dir / "instance.token"),
        )
        why, _ = direct_read.local_view(granted, self._base)
        if why:
            return why
        staging = (self._base or data_dir) / begun.local_dir
        self._shard_bytes = begun.shard_bytes or (1 << 30)
        try:
            owner = staging.stat().st_uid
        except OSError as exc:
            return f"cannot see {staging}: {exc.strerror}"
        if owner != os.geteuid():  # the daemon could not delete what this process creates
            return (
                f"the daemon runs as uid {owner} and this process as uid {os.geteuid()}: "
                "files written here could not be deleted by the daemon"
            )
        try:
            self._shard = self._new_shard(staging, 0)
        except OSError as exc:  # a read-only mount (EROFS), permissions (EACCES)
            return f"cannot write under {staging}: {exc.strerror}"
        except Exception as exc:  # the store's DiskFull, LMDB refusing the directory
            return f"cannot write under {staging}: {exc}"
        self._staging = staging
        return ""

    def _new_shard(self, staging: Path, index: int) -> Any:
        from client.format.store import ShardWriter  # imports lmdb: only when writing here

        return ShardWriter(staging / f"shard-{index:05d}", self._shard_bytes)

    def add(
        self, values: Sequence[bytes | memoryview], raw_bytes: int, num_elements: int | None = None
    ) -> None:
        if self._staging is None:
            super().add(values, raw_bytes, num_elements)
            return
        n = len(values) if num_elements is None else num_elements
        with self._lock:
            if self._aborted:
                raise ShardcacheError("the write was aborted")
            self._check_stream()
            self._data.extend(values)
            self._pending_bytes += sum(len(v) for v in values)
            self._raw_bytes += raw_bytes
            self._pending_elements += n
            if self._pending_bytes >= self._chunk_bytes:
                self._append()
        self.num_elements += n

    def _append(self) -> None:
        """Store the values held so far as one LMDB transaction (~chunk_bytes, as the
        daemon stores a chunk: fewer, larger transactions leave fewer copied pages)."""
        if not self._data:
            return
        values, raw, n = self._data, self._raw_bytes, self._pending_elements
        self._data, self._pending_bytes, self._raw_bytes, self._pending_elements = [], 0, 0, 0
        assert self._staging is not None
        try:
            if self._shard is not None and self._shard.stored_bytes >= self._shard_bytes:
                self._close_shard()
            if self._shard is None:
                self._shard = self._new_shard(self._staging, len(self._staged))
            self._shard.append(values, raw, n)
        except Exception as exc:
            raise self._give_up(exc) from exc

    def _close_shard(self) -> None:
        shard, self._shard = self._shard, None
        shard.commit()  # fsync, close
        self._staged.append(
            pb.StagedShard(
                index=len(self._staged),
                num_elements=shard.num_elements,
                num_records=shard.num_records,
                stored_bytes=shard.stored_bytes,
                raw_bytes=shard.raw_bytes,
            )
        )

    def _give_up(self, exc: Exception) -> ShardcacheError:
        """Delete what was written here, tell the daemon why (it logs it and discards the
        write), and return the error to raise. Call with the lock held."""
        error = _translate(exc)
        self._discard()
        with contextlib.suppress(ShardcacheError):
            self._send(pb.WriteCacheRequest(finish=pb.WriteFinish(failed=str(error))))
            self._end_requests()
            with contextlib.suppress(grpc.RpcError):
                for _ in self._responses:  # type: ignore[union-attr]
                    pass  # until the daemon ends the stream: it has read the reason
        return error

    def _discard(self) -> None:
        self._data, self._pending_bytes, self._raw_bytes, self._pending_elements = [], 0, 0, 0
        shard, self._shard = self._shard, None
        if shard is not None:
            shard.abort()
        if self._staging is not None:
            for staged in self._staged:
                shutil.rmtree(self._staging / f"shard-{staged.index:05d}", ignore_errors=True)
        self._staged = []

    def finish(self) -> pb.Cache:
        if self._staging is not None:
            with self._lock:
                if self._aborted:
                    raise ShardcacheError("the write was aborted")
                self._append()
                try:
                    if self._shard is not None and not self._shard.num_records:
                        self._shard.abort()  # opened at begin(), never written: no shard
                        self._shard = None
                    if self._shard is not None:
                        self._close_shard()
                except Exception as exc:
                    raise self._give_up(exc) from exc
        return super().finish()

    def _finish_message(self) -> pb.WriteFinish:
        return pb.WriteFinish(num_elements=self.num_elements, staged_shards=self._staged)

    def abort(self) -> None:
        super().abort()  # first: a thread waiting on the stream wakes up
        with self._lock:
            self._aborted = True
            self._discard()
