"""Buffers: a read's large batch arrays, in maps of its own, reused once nothing refers to them.

Each chunk is decoded into fresh arrays that TensorFlow takes without a copy
and keeps until the chunk's elements have left the pipeline. Made with malloc,
those few-MiB arrays come from the malloc arena of whichever reader thread
decodes (glibc gives each thread its own, up to 8 per core), and go back to it
when TensorFlow lets go. Every arena keeps up to its trim threshold of freed
memory at its top (16 MiB, client/tf/malloc.py), so a read's resident memory
grew as more threads' arenas filled, with the data read: measured on 602 KB
elements, RssAnon after reading 2.56 GB directly was 100-180 MB above the
warmed-up process, nearly all of it free memory held in 17 arenas, and grew
by ~25 MB with each further pass (malloc_trim frees almost none of it: it
cannot trim an arena's top). docs/design.md has the alternatives measured.

A read makes its large arrays (MIN_BYTES and up) in anonymous private maps
instead, and reuses a map as soon as its reference count says that only the
read holds it: every array made from it (TensorFlow's tensor, a trimmed view)
keeps it referenced, so a map still in use is never handed out. The read holds
as many as were in use at once (the chunks in flight plus those tf.data keeps
downstream), and every pass of it (every epoch of one dataset) reuses them: a
map made afresh costs the kernel a zeroed page for every page written (a
warm epoch of 602 KB images spent a sixth of its time zeroing the first
batches' maps when each pass made its own). They go with the read (the
dataset), or with close() for a pass that owns its Buffers: a map is unmapped,
its memory back to the kernel, once its last array goes.
"""

from __future__ import annotations

import math
import mmap
import sys
import threading

import numpy as np

from client.format.fixed_decode import aligned_empty

#: Arrays smaller than this come from malloc as they are: its bins reuse them well.
MIN_BYTES = 256 << 10
#: Maps of at least this many bytes ask for transparent huge pages.
_HUGE_BYTES = 4 << 20
_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


class Buffers:
    """Aligned arrays for one pass, the large ones in maps of its own, reused once free;
    thread-safe."""

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []  # each referenced here and by the arrays made of it
        self._lock = threading.Lock()
        self.made = 0  # maps made, for tests and stats

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous array, ALIGN-byte aligned (as aligned_empty)."""
        nbytes = math.prod(shape) * dtype.itemsize  # not np.prod: ~3 us a call
        if nbytes < MIN_BYTES:
            return aligned_empty(shape, dtype)
        raw = np.frombuffer(self._take(nbytes), np.uint8, nbytes)  # page-aligned
        return raw.view(dtype).reshape(shape)

    def _take(self, need: int) -> mmap.mmap:
        """The smallest free map of need bytes or more (a read's short last batch takes a full
        one's), else a new one of need bytes, which replaces a free one too small for it (so
        the read holds no more than it had in use at once)."""
        with self._lock:
            best = other = -1
            for i in range(len(self._maps)):
                if sys.getrefcount(self._maps[i]) > 2:  # more than this list's and the argument's
                    continue
                size = len(self._maps[i])
                if need <= size:
                    if best < 0 or size < len(self._maps[best]):
                        best = i
                else:
                    other = i
            if best >= 0:
                return self._maps[best]
            # private anonymous memory (RssAnon), unmapped as soon as nothing refers to it
            made = mmap.mmap(-1, need, flags=mmap.MAP_PRIVATE)
            if need >= _HUGE_BYTES and _HUGEPAGE is not None:
                # in 2 MiB pages where the kernel allows: a fresh map's first write faults
                # each 4 KiB page in one by one otherwise, ~0.3 ms per 602 KB image
                # (NumPy asks the same for its large arrays)
                made.madvise(_HUGEPAGE)
            self.made += 1
            if other >= 0:
                self._maps[other] = made
            else:
                self._maps.append(made)
            return made

    def held(self) -> int:
        """Maps the pass holds (in use or free)."""
        with self._lock:
            return len(self._maps)

    def close(self) -> None:
        """Let every map go: free ones are unmapped now, those in use with their last array."""
        with self._lock:
            self._maps = []
