"""Landing: where a data-plane chunk's values are received, the rows of the batch being filled.

A batch of fixed-shape numbers is filled in its own arrays (CacheReads.fill). A stored
value kept raw is a 5-byte header (tag, CRC-32) and its body as it is (docs/format.md):

- one element: its record, its leaves' bytes back to back, so each leaf's part is that
  element's row of the leaf's batch array, byte for byte;
- a block of m elements in a ``plain_raw`` layout (or one not byte-shuffled): the m
  records back to back, so for a cache of one leaf the body is m consecutive rows of the
  leaf's batch array.

So the socket can write the value there itself: the header into a scratch buffer, the body
into its rows (``recvmsg_into``, client/wire/plane.py recv_parts), and the reader never
copies it again; the CRC-32 is then checked on the rows where they lie (Decoder.landed).
One copy per byte after the kernel's, as a direct read makes from the page cache.

A chunk lands only when every value in it has a raw value's size and its rows lie in the
batch; any other chunk (a zstd value; a block cut by the request's ends; a byte-shuffled
block of format 2 or 3) is received into a buffer and decoded as before. Not landed either:
records under MIN_RECORD_BYTES one per value (a value's few buffers and its own CRC call
would cost more than the copy they save), and blocks of several leaves (their records
interleave the leaves: a buffer per record and leaf, hundreds a block, cost more than the
copy of the block they save).

A zstd frame is kept only when the body is at least 1.25 times its size, so a value as
long as a raw one of its elements is raw in practice; Decoder.landed still unpacks one that
is not.
"""

from __future__ import annotations

import numpy as np

from client.format.fixed_decode import MIN_RECORD_BYTES
from client.format.layout import Layout
from client.format.values import RAW_HEADER
from client.read.fetching.fetch import Landed


class Landing:
    """A fetch.Land into rows [row, end) of a batch's arrays (one per leaf); see landing()."""

    def __init__(self, layout: Layout, outs: list[np.ndarray], row: int, end: int) -> None:
        self._record = layout.record_size
        self._k = layout.block_elements
        self._outs = outs
        self._row, self._end = row, end
        #: each leaf's batch as flat bytes, and the bytes of one element's row of it
        self._leaves = [
            (out.reshape(-1).view(np.uint8).data, leaf.nbytes)
            for leaf, out in zip(layout.leaves, outs)
            if leaf.nbytes
        ]
        plain = self._k == 1 or layout.plain_raw or layout.block_shuffle == 1
        #: single elements land (one element per value, or ReadElements' one-element blocks)
        self.singles = plain and self._record >= MIN_RECORD_BYTES
        #: blocks land: plain, one leaf of bytes (a block's body is then its rows)
        self.blocks = (
            plain
            and self._k > 1
            and len(self._leaves) == 1
            and self._k * self._record >= MIN_RECORD_BYTES
        )

    def __call__(self, position: int, sizes: np.ndarray, elements: int) -> Landed | None:
        """Where the values of sizes, holding elements at position of the request, are
        received: their rows (and a header each), or None when they are not all raw
        values whose rows lie in the batch."""
        lo, n = self._row + position, len(sizes)
        if position < 0 or lo + elements > self._end or not n:
            return None
        if elements == n:  # one element per value
            return self._singles_at(lo, sizes) if self.singles else None
        if not self.blocks or not (n - 1) * self._k < elements <= n * self._k:
            return None
        return self._blocks_at(lo, sizes, elements)

    def _singles_at(self, lo: int, sizes: np.ndarray) -> Landed | None:
        n = len(sizes)
        if not bool((sizes == RAW_HEADER + self._record).all()):
            return None
        heads = memoryview(bytearray(n * RAW_HEADER))
        return Landed(
            [heads[i * RAW_HEADER : (i + 1) * RAW_HEADER] for i in range(n)],
            [
                [flat[r * size : (r + 1) * size] for flat, size in self._leaves]
                for r in range(lo, lo + n)
            ],
            [out[lo : lo + n] for out in self._outs],
        )

    def _blocks_at(self, lo: int, sizes: np.ndarray, elements: int) -> Landed | None:
        n, k, record = len(sizes), self._k, self._record
        last = elements - (n - 1) * k
        if not bool((sizes[:-1] == RAW_HEADER + k * record).all()) or (
            int(sizes[-1]) != RAW_HEADER + last * record
        ):
            return None
        heads = memoryview(bytearray(n * RAW_HEADER))
        ((flat, _),) = self._leaves
        starts = [lo + v * k for v in range(n)]
        return Landed(
            [heads[i * RAW_HEADER : (i + 1) * RAW_HEADER] for i in range(n)],
            [[flat[a * record : min(a + k, lo + elements) * record]] for a in starts],
            [out[lo : lo + elements] for out in self._outs],
            per=k,
        )


def landing(layout: Layout, outs: list[np.ndarray], row: int, end: int) -> Landing | None:
    """Where a request filling rows [row, end) of outs (a batch, one array per leaf of
    layout, the layout its chunks are decoded by) can receive its values, or None for a
    layout whose values cannot land: records that are not all fixed-shape numbers, small
    records one per value, byte-shuffled blocks."""
    if not layout.fixed_numeric or len(outs) != len(layout.leaves):
        return None
    for leaf, out in zip(layout.leaves, outs):
        if (
            out.dtype != leaf.np_dtype
            or out.shape[1:] != tuple(leaf.fixed_shape)
            or not out.flags.c_contiguous
        ):
            return None
    found = Landing(layout, outs, row, end)
    return found if found.singles or found.blocks else None
