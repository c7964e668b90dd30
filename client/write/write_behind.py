"""Write-behind for write-through epochs: encode, compress and send in a thread of its own.

The epoch's generator hands each source batch to :class:`WriteBehind` and
yields it to TensorFlow at once; the thread packs it into stored values
(client/format/blocks.py: blocks of small elements, one value per large one) and sends
them to the daemon while the generator fetches the next batch. Without it the
generator did all of that between two yields and the source pipeline, which
runs only a few elements ahead of its consumer, stood still meanwhile (epoch 1
used 1.2 of 2 cores; docs/writing.md has the profile).

A bounded queue of batches sits between the two (google/grain's prefetch
pattern): a daemon slower than the source makes put() wait, so memory stays
bounded. A failure of the write itself (daemon gone, disk full) ends the write
with a warning and the epoch goes on from the source; any other error (a bug,
an element the codec refuses) reaches the epoch at its next put() or finish().

With $SHARDCACHE_COMPRESS=spare-cpu a slice is compressed only while the
process has CPU to spare (client/write/spare_cpu.py): when the source pipeline
keeps every core busy, compression would lengthen the epoch, so the slice is
stored raw. By default every slice is compressed.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from client._transport import pb
from client.errors import ShardcacheError
from client.format.blocks import BlockPacker
from client.format.layout import Layout
from client.write.spare_cpu import CompressGate, SpareCpu, compress_mode
from client.write.stream import CacheWriter

log = logging.getLogger("client")

#: Source batches waiting for the writer thread.
QUEUE_BATCHES = 2
#: A batch of fixed-shape elements is packed and written this many bytes at a time: a
#: tapped write epoch hands over the consumer's batches (256 images are 154 MB), whose
#: stored values would otherwise all be made before the first is written.
SLICE_BYTES = 4 << 20
_DONE = None


class WriteBehind:
    """Sends a write-through epoch's batches to writer from a background thread.

    put() every batch, then finish() to commit; close() always (it aborts an
    uncommitted write and joins the thread).
    """

    def __init__(
        self, writer: CacheWriter, layout: Layout, queue_batches: int = QUEUE_BATCHES
    ) -> None:
        self._writer: CacheWriter | None = writer
        self._layout = layout
        self._queue: queue.Queue[tuple[int, Sequence[Any]] | None] = queue.Queue(queue_batches)
        self._stop = threading.Event()
        self._error: BaseException | None = None  # not a write failure: re-raised to the epoch
        # Set with _error and never cleared: a batch was lost, so nothing more is written and
        # finish() commits nothing, even if the epoch goes on (a tapped epoch's prefetch asks
        # for the next batches after the error has reached the consumer).
        self._failed = False
        self._committed = False
        self._gate = CompressGate(SpareCpu()) if compress_mode() == "spare-cpu" else None
        self.uncompressed = 0  # elements stored raw because no core was spare
        self._thread = threading.Thread(
            target=self._run, name="shardcache-write-behind", daemon=True
        )
        self._thread.start()

    @property
    def writing(self) -> bool:
        """False once the write has failed or stopped: put() then drops batches."""
        return self._writer is not None and not self._stop.is_set() and not self._failed

    def put(self, n: int, batch: Sequence[Any]) -> None:
        """Queue a batch of n elements (decode_batch's form); waits while the queue is full."""
        self._raise_error()
        if self.writing:
            self._queue.put((n, batch))

    def finish(self) -> pb.Cache | None:
        """Send the rest and commit; None when the write failed (already logged)."""
        self._queue.put(_DONE)
        self._thread.join()
        self._raise_error()
        if self._writer is None or self._failed:
            return None
        try:
            cache = self._writer.finish()
        except ShardcacheError as exc:
            self._give_up(exc)
            return None
        self._committed = True
        if self.uncompressed:
            log.info(
                "cache %r: %d of %d elements stored uncompressed, every core being busy "
                "with the source pipeline (SHARDCACHE_COMPRESS=spare-cpu; docs/writing.md)",
                cache.name,
                self.uncompressed,
                cache.num_elements,
            )
        return cache

    def close(self) -> None:
        """Stop the thread; an uncommitted write is cancelled (the daemon discards it)."""
        self._stop.set()
        writer = self._writer
        if writer is not None and not self._committed:
            writer.abort()  # also unblocks the thread if it waits on the stream
        while self._thread.is_alive():
            try:  # the thread discards what is queued once _stop is set
                self._queue.put(_DONE, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _give_up(self, exc: ShardcacheError) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()
        log.warning(
            "stopped writing cache (%s); this epoch continues from the source "
            "pipeline and the next one will try again",
            exc,
        )

    def _slices(self, n: int, batch: Sequence[Any]) -> Iterator[tuple[int, Sequence[Any]]]:
        """batch as consecutive slices of about SLICE_BYTES (views, no copy)."""
        size = self._layout.record_size if self._layout.fixed_numeric else 0
        if not size or n * size <= SLICE_BYTES:
            yield n, batch
            return
        step = max(1, SLICE_BYTES // size)
        for i in range(0, n, step):
            if self._stop.is_set():
                return
            yield min(step, n - i), [leaf[i : i + step] for leaf in batch]

    def _send(
        self, writer: CacheWriter, pack: Callable[[bool], tuple[list[bytes], int, int]]
    ) -> None:
        """Pack (compressed while CPU is spare) and send: pack(compress) -> values."""
        compress = self._gate is None or self._gate.compress()
        began = time.thread_time()
        values, raw, n = pack(compress)
        if self._gate is not None:
            self._gate.packed(time.thread_time() - began)
        writer.add(values, raw, n)
        self.uncompressed += 0 if compress else n

    def _run(self) -> None:
        packer = BlockPacker(self._layout)
        while True:
            item = self._queue.get()
            writer = self._writer
            if writer is None or self._stop.is_set() or self._failed:
                if item is _DONE:
                    return
                continue  # failed or closing: drain so that put() never waits forever
            try:  # _DONE: the last, short block
                if item is _DONE:
                    self._send(writer, packer.flush)
                else:
                    for n, part in self._slices(*item):
                        self._send(writer, functools.partial(packer.add, part, n))
            except ShardcacheError as exc:
                if not self._stop.is_set():  # close() cancels the stream: not a failure
                    self._give_up(exc)
            except BaseException as exc:
                self._error, self._failed = exc, True
            if item is _DONE:
                return
