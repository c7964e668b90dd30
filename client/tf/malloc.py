"""Keep glibc from returning (and re-faulting) large buffers on every batch.

TensorFlow's ``from_generator`` sets glibc's M_TRIM_THRESHOLD to 128 KiB when
it first runs ("Memory patch applied" in its log). Setting it pins the mmap
threshold too, so from then on every buffer over 128 KiB (each decoded chunk,
each 600 KB element, each batch) is a fresh mmap whose pages fault in one by
one and go back to the kernel on free. Measured here on a 600 KB-element cache,
epoch 2: 430,000 minor faults and ~400 elements/s before; ~8,000 faults and
~800-900 elements/s after raising both thresholds.

The trim threshold bounds what each malloc arena keeps: glibc makes up to 8
arenas per core as threads come and go, so what is kept grows epoch by epoch
until every arena holds its share. Measured on 12 epochs of a 300 MB cache
(peak RssAnon, first -> last epoch, read speed):

| trim threshold       | RssAnon       | elements/s |
|----------------------|---------------|------------|
| 128 KiB (TF's)       | 331 -> 371 MiB | ~580      |
| 16 MiB (chosen)      | 360 -> 497 MiB, flat from epoch 9 | ~900 |
| 1 GiB                | 372 -> 517 MiB, still rising | ~930 |

So the kept memory is bounded by arenas x 16 MiB whatever the dataset size. The
read's own chunk arrays stay out of the arenas (client/read/assembly/buffers.py): what
arenas keep comes from TensorFlow's batches and gRPC's messages
(docs/benchmarks.md, RssAnon by read path at 1x, 4x and 10x the data).

The thresholds are process-wide. Pass ``tune_malloc=False`` to CacheClient, or
set SHARDCACHE_TUNE_MALLOC=0, to leave them alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

from client import settings

log = logging.getLogger("client")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Buffers up to this size come from the heap (a batch of 256 x 600 KB is 154 MB).
MMAP_THRESHOLD = 512 << 20
#: Older glibc refuses thresholds above half its 64 MiB heap size.
FALLBACK_MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 16 << 20


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def enabled(requested: bool) -> bool:
    return requested and settings.TUNE_MALLOC.get()


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds; False where there is no glibc."""
    libc = _libc()
    if libc is None:
        return False
    ok = bool(
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        or libc.mallopt(_M_MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD)
    )
    ok = bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and ok
    if not ok:
        log.debug("mallopt refused the thresholds; large buffers stay mmap-backed")
    return ok
