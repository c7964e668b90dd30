"""A writer's lease on a WRITING cache (cacheserver/catalog/catalog.py hands them out).

The session appends values to the cache's shards (one LMDB environment each,
client/format/store.py), cutting a new shard every ``shard_bytes``, or adopts the
shard files a same-host client staged (cacheserver/catalog/direct_writes.py); finish() commits
the last shard and the manifest, abort() discards everything it wrote. The
WriteCache handler (cacheserver/rpc/streams.py) drives it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from cacheserver.catalog import direct_writes
from cacheserver.catalog.capacity import Capacity
from cacheserver.catalog.manifest import CacheRecord, ShardInfo
from client.format.blocks import block_elements
from client.format.store import ShardWriter
from client.wire.status import InvalidArgument


class WriteSession:
    """One writer's lease on a WRITING cache: append, then finish or abort."""

    def __init__(
        self,
        record: CacheRecord,
        directory: Path,
        shard_bytes: int,
        capacity: Capacity,
        release: Callable[[WriteSession, bool], None],
    ) -> None:
        self.record = record
        self._capacity = capacity
        self._release = release  # the catalog's: frees the reservation, forgets an abort
        self._dir = directory
        self.shard_bytes = shard_bytes
        self._writer: ShardWriter | None = None
        self._done = False
        self._k = block_elements(record.layout_json)
        self._staging: Path | None = None  # same-host writes (cacheserver/catalog/direct_writes.py)
        #: Elements of the committed shards: record.num_elements sums every shard, and a
        #: cache of 100,000 small shards summed them once per shard (quadratic).
        self._committed = record.num_elements

    def append(self, values: Sequence[bytes | memoryview], raw_bytes: int) -> None:
        if self._writer is not None and self._writer.stored_bytes >= self.shard_bytes:
            self._commit_shard()  # the last shard stays open until finish(): see there
        if self._writer is None:
            index = len(self.record.shards)
            self._writer = ShardWriter(self._dir / f"shard-{index:05d}", self.shard_bytes)
        self._capacity.reserve(self.record.name, sum(len(v) for v in values))
        self._writer.append(values, raw_bytes, len(values) * self._k)

    def _commit_shard(self) -> None:
        writer, self._writer = self._writer, None
        assert writer is not None
        writer.commit()
        shard = ShardInfo(
            len(self.record.shards),
            self._committed,
            writer.num_elements,
            writer.stored_bytes,
            writer.raw_bytes,
        )
        self.record.add_shard(self._dir, shard)
        self._committed += writer.num_elements

    def stage(self) -> Path:
        """Same-host writes: the directory the client writes its shard files into."""
        self._staging = direct_writes.make(self._dir)
        return self._staging

    def adopt(self, shards: Sequence[direct_writes.StagedShard]) -> None:
        """Check the client's staged shards and take them as this cache's shards."""
        if self._staging is None or self._writer is not None or self.record.shards:
            raise InvalidArgument(
                "staged shards can only commit a write begun with "
                "WriteBegin.local that sent no chunks"
            )
        direct_writes.adopt(
            self.record,
            self._dir,
            self._staging,
            shards,
            lambda n: self._capacity.reserve(self.record.name, n, written=True),
        )
        self._committed = self.record.num_elements

    @property
    def num_elements(self) -> int:
        pending = self._writer.num_elements if self._writer else 0
        return self._committed + pending

    def finish(self, num_elements: int) -> CacheRecord:
        """Commit the last shard and the manifest: the cache becomes READY.

        Blocks of k elements: every value sent counted k elements; only the very
        last one may hold fewer, which the writer's total says (docs/format.md, "Blocks").
        """
        short = self.num_elements - num_elements
        if not 0 <= short < self._k or (short and self._writer is None):
            raise InvalidArgument(
                f"writer says {num_elements} elements, sent "
                f"{self.num_elements}" + (f" in blocks of {self._k}" if self._k > 1 else "")
            )
        if self._writer is not None:
            self._writer.num_elements -= short
            self._commit_shard()
        if self._staging is not None:  # the client streamed after all (or wrote nothing)
            shutil.rmtree(self._staging, ignore_errors=True)
        self.record.commit(self._dir)
        self._done = True
        self._release(self, True)
        return self.record

    def abort(self) -> None:
        """Discard everything this session wrote; no-op after finish()."""
        if self._done:
            return
        self._done = True
        if self._writer is not None:
            self._writer.abort()
        self._release(self, False)
