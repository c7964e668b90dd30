"""Landing: where a data-plane chunk's values are received, the rows of the batch being filled.

A batch of fixed-shape numbers is filled in its own arrays (CacheReads.fill). A
stored value of one element kept raw is a 5-byte header (tag, CRC-32) and the
element's record, its leaves' bytes back to back (docs/format.md): each leaf's
part is that element's row of the leaf's batch array, byte for byte. So the
socket can write the value there itself: the header into a scratch buffer, each
leaf's bytes into its row (``recvmsg_into``, client/wire/plane.py recv_parts),
and the reader never copies them again; the CRC-32 is then checked on the rows
where they lie (Decoder.landed). One copy per byte after the kernel's, as a
direct read makes from the page cache.

A chunk lands only when every value in it has a raw record's size and its rows
lie in the batch; any other chunk (blocks, which are byte-shuffled and mostly
compressed; a zstd record; a chunk reaching outside the request) is received
into a buffer and decoded as before. Records under MIN_RECORD_BYTES are not
landed: a value's few buffers and its own CRC call would cost more than the
copy they save, and such records are stored in blocks anyway.
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
        self._size = RAW_HEADER + layout.record_size
        self._outs = outs
        self._row, self._end = row, end
        #: each leaf's batch as flat bytes, and the bytes of one element's row of it
        self._leaves = [
            (out.reshape(-1).view(np.uint8).data, leaf.nbytes)
            for leaf, out in zip(layout.leaves, outs)
            if leaf.nbytes
        ]

    def __call__(self, position: int, sizes: np.ndarray) -> Landed | None:
        """Where the values of sizes, at position of the request, are received: their rows
        (and a header each), or None when they are not all raw records of the batch."""
        lo, n = self._row + position, len(sizes)
        if position < 0 or lo + n > self._end or not bool((sizes == self._size).all()):
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


def landing(layout: Layout, outs: list[np.ndarray], row: int, end: int) -> Landing | None:
    """Where a request filling rows [row, end) of outs (a batch, one array per leaf of
    layout, the layout its chunks are decoded by) can receive its values, or None for a
    layout whose values cannot land: blocks, records that are not all fixed-shape numbers,
    small records."""
    if (
        layout.block_elements != 1
        or not layout.fixed_numeric
        or layout.record_size < MIN_RECORD_BYTES
        or len(outs) != len(layout.leaves)
    ):
        return None
    for leaf, out in zip(layout.leaves, outs):
        if (
            out.dtype != leaf.np_dtype
            or out.shape[1:] != tuple(leaf.fixed_shape)
            or not out.flags.c_contiguous
        ):
            return None
    return Landing(layout, outs, row, end)
