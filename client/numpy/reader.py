"""ArrayReader: what cc.numpy() returns, a cache's epochs as NumPy arrays, no TensorFlow.

The same read path as cc.dataset(): the epoch's share cut into chunks
(client/read/assembly/chunks.py's EpochChunks: direct reads, the data plane, gRPC, a
fleet's owners), the same plan (client/read/planning/plan.py: shuffle, worker shares,
epochs, resume and elastic resume), run ahead on a few threads
(client/numpy/prefetch.py) and turned into the stored structure
(client/numpy/batches.py). Each ``iter()`` reads the next epoch, as each
iteration of cc.dataset()'s dataset does; ``state()`` is the ReadState after the
elements handed out so far, which cc.dataset() and cc.numpy() both resume.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from client._daemons import Daemons
from client.numpy.batches import Columns, format_of
from client.numpy.prefetch import MAX_AHEAD, Prefetch, threads
from client.read.assembly.chunks import EpochChunks
from client.read.opening import open_read
from client.read.planning import plan
from client.read.planning.shares import Batches

#: A chunk holds as many whole batches as fit in this many stored bytes (one at least): each
#: chunk's call costs a handoff to the prefetch thread and back, which a batch of 64 1 KB
#: elements paid alone (0.6x the elements/s of the same calls without a thread; batches of 512:
#: the same), docs/benchmarks.md, "PyTorch over a cache and over a NumPy memmap".
MIN_CHUNK_BYTES = 512 << 10


class ArrayReader:
    """A READY cache's elements as nested structures of NumPy arrays, one epoch per iter().

    Without batch_size, each element as stored (a dict, tuple or named tuple of
    arrays; a scalar string as bytes, a string array as an object array of bytes).
    With batch_size, batches of that many elements: fixed-shape components
    stacked, variable-shape ones a list of one array per element.
    """

    def __init__(
        self, daemons: Daemons, local_data_dir: Path | None, name: str, options: plan.ReadOptions
    ) -> None:
        self._read = read = open_read(daemons, local_data_dir, name, options, "call numpy() again")
        self.cache = read.cache
        self.structure = format_of(name, read.cache.element_spec, read.layout)
        self._columns = Columns(self.structure)
        self.options = read.options
        self._epochs = read.epochs()
        self._lock = threading.Lock()
        # where the last iteration began (epoch, start) and how many elements it handed out
        self._at: tuple[int, int, int] = (self.options.epoch, self.options.start, 0)

    @property
    def element_count(self) -> int:
        """Elements of each whole epoch of this worker's share; -2 when the first
        iteration is resumed mid-epoch (it yields fewer)."""
        return self._read.cardinality

    def state(self) -> plan.ReadState:
        """Where this reader stands: the ReadState after the elements handed out by the
        latest iteration; pass it as resume= to cc.numpy() or cc.dataset()."""
        with self._lock:
            epoch, start, seen = self._at
        options = self.options
        if epoch != options.epoch:  # a later epoch: the whole share, from its start
            options = dataclasses.replace(options, epoch=epoch, start=0, remaining=None)
        return plan.state_of(self.cache, options, start - options.start + seen)

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self._epochs.take()
        with self._lock:
            self._at = (epoch, start, 0)
        chunks = self._open(epoch, start)
        try:
            batch_size = self.options.batch_size
            if batch_size is None:
                for element in self._columns.elements(chunks):
                    self._seen(1)
                    yield element
            else:
                for n, batch in self._columns.batches(
                    chunks, batch_size, self.options.drop_remainder
                ):
                    self._seen(n)
                    yield batch
        finally:  # an early stop ends the read's lease and threads now
            chunks.close()

    def _seen(self, n: int) -> None:
        with self._lock:
            epoch, start, seen = self._at
            self._at = (epoch, start, seen + n)

    def _open(self, epoch: int, start: int) -> Prefetch:
        size = self.options.batch_size
        batches = None
        if size is not None:  # chunks of whole batches, cut into batches by Columns
            element = max(1, self.cache.stored_bytes // max(1, self.cache.num_elements))
            per_chunk = max(1, MIN_CHUNK_BYTES // (size * element))
            drop = self.options.drop_remainder and per_chunk == 1  # else Columns drops it
            batches = Batches(size * per_chunk, drop)
        chunks = self._read.chunks(epoch, start, batches)
        assert isinstance(chunks, EpochChunks)
        parallel = self.options.parallel_shards
        if parallel:
            return Prefetch(chunks, parallel)
        ahead = self.options.prefetch_bytes // max(chunks.chunk_bytes, 1)
        return Prefetch(
            chunks,
            min(MAX_AHEAD, ahead),
            threads(chunks.path, self.cache.stored_bytes, self.cache.num_elements),
        )

    def __repr__(self) -> str:
        return (
            f"ArrayReader({self.cache.name!r}, epoch={self._at[0]}, "
            f"batch_size={self.options.batch_size})"
        )
