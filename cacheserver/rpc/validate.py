"""Every request checked at the edge, before it reaches the catalog or the store.

Plain functions of a request's fields (no gRPC): each raises InvalidArgument saying
what is wrong and what is allowed. The servicer (service.py) calls them first thing
in each RPC; the catalog keeps its own invariants behind them. Limits:
docs/protocol.md, "Limits".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from cacheserver.catalog.direct_writes import StagedShard
from cacheserver.catalog.manifest import validate_name
from cacheserver.logs import shown
from cacheserver.reader_reports import PATHS, Figures, Labels
from client.format.layout import Layout
from client.format.values import MAX_ZSTD_EXPANSION
from client.wire.limits import LABEL_PATTERN, MAX_RANK, MAX_REPORTED_READERS, check_indices
from client.wire.status import InvalidArgument

MAX_FINGERPRINT_CHARS = 512
MAX_ELEMENT_SPEC_BYTES = 1 << 20
MAX_SHARD_BYTES = 1 << 40
MAX_TTL_SECONDS = float(1 << 32)
MAX_WATCH_INTERVAL = 3600.0
MAX_OPERATION_NAME_CHARS = 256
MAX_LEASE_ID_CHARS = 64
MAX_ENTRY_POINT_CHARS = 1024
_LABEL = re.compile(LABEL_PATTERN)


def name(value: str) -> str:
    return validate_name(value)


def _text(value: str, what: str, limit: int, required: bool) -> str:
    if required and not value:
        raise InvalidArgument(f"{what} is empty")
    if len(value) > limit:
        raise InvalidArgument(f"{what} is {len(value)} characters; the limit is {limit}")
    if not value.isprintable():
        raise InvalidArgument(
            f"{what} {shown(value, 64)!r} holds control characters; use printable characters only"
        )
    return value


def fingerprint(value: str, required: bool = False) -> str:
    return _text(value, "fingerprint", MAX_FINGERPRINT_CHARS, required)


def layout(layout_json: str) -> Layout:
    """The write's layout, parsed with bounded size and depth and checked leaf by leaf."""
    try:
        return Layout.from_json(layout_json)
    except ValueError as exc:
        raise InvalidArgument(
            f'layout_json: {shown(str(exc), 400)}; see docs/format.md, "Layouts"'
        ) from None


def write_begin(
    cache: str, fp: str, layout_json: str, element_spec: bytes, shard_bytes: int
) -> Layout:
    name(cache)
    fingerprint(fp, required=True)
    if len(element_spec) > MAX_ELEMENT_SPEC_BYTES:
        raise InvalidArgument(
            f"element_spec is {len(element_spec)} bytes; the limit is {MAX_ELEMENT_SPEC_BYTES}"
        )
    if shard_bytes > MAX_SHARD_BYTES:
        raise InvalidArgument(
            f"shard_bytes {shard_bytes} is over the limit {MAX_SHARD_BYTES} "
            "(1 TiB); 0 picks the daemon's default (1 GiB)"
        )
    return layout(layout_json)


def _raw_bytes(raw_bytes: int, stored: int, what: str) -> None:
    """Raw (uncompressed) bytes a writer declares for stored bytes it sent: no stored value
    decompresses to more than MAX_ZSTD_EXPANSION times its size (client/format/values.py)."""
    if raw_bytes > stored * MAX_ZSTD_EXPANSION:
        raise InvalidArgument(
            f"{what} declares raw_bytes {raw_bytes} for {stored} stored "
            f"bytes; at most {MAX_ZSTD_EXPANSION} times the stored bytes"
        )


def write_chunk(lengths: bytes, data_bytes: int, raw_bytes: int) -> None:
    if len(lengths) % 4:
        raise InvalidArgument(
            f"malformed WriteChunk: {len(lengths)} bytes of lengths is not "
            "a whole number of little-endian u32s"
        )
    _raw_bytes(raw_bytes, data_bytes, "a WriteChunk")


def write_finish(staged: Sequence[StagedShard]) -> None:
    for s in staged:
        _raw_bytes(s.raw_bytes, s.stored_bytes, f"staged shard {s.index}")


def read(cache: str, fp: str) -> None:
    """ReadShard, AcquireReadLease: the cache and the fingerprint planned with."""
    name(cache)
    fingerprint(fp)


def read_elements(cache: str, fp: str, indices: bytes) -> None:
    read(cache, fp)
    if len(indices) % 8:
        raise InvalidArgument(
            f"indices is {len(indices)} bytes, not a whole number of little-endian uint64s"
        )
    check_indices(len(indices) // 8)


def retention(cache: str, ttl_seconds: float | None) -> None:
    name(cache)
    if ttl_seconds is not None and not 0 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidArgument(
            f"ttl_seconds must be from 0 (0 clears it) to {MAX_TTL_SECONDS:.0f}, got {ttl_seconds}"
        )


def operation(op_name: str) -> str:
    return _text(op_name, "operation name", MAX_OPERATION_NAME_CHARS, True)


def watch_interval(interval: float) -> float:
    if not (math.isfinite(interval) and 0 <= interval <= MAX_WATCH_INTERVAL):
        raise InvalidArgument(
            f"interval must be from 0 (the default, 0.5 s) to "
            f"{MAX_WATCH_INTERVAL:.0f} seconds, got {interval}"
        )
    return interval


def lease_id(value: str) -> str:
    return _text(value, "lease_id", MAX_LEASE_ID_CHARS, False)


def start_materialize(cache: str, entry_point: str, element_spec: bytes, fp: str) -> None:
    name(cache)
    fingerprint(fp)
    _text(entry_point, "entry_point", MAX_ENTRY_POINT_CHARS, False)
    if len(element_spec) > MAX_ELEMENT_SPEC_BYTES:
        raise InvalidArgument(
            f"element_spec is {len(element_spec)} bytes; the limit is {MAX_ELEMENT_SPEC_BYTES}"
        )


def report_reads(reporter: str, readers: Sequence[Any]) -> list[tuple[Labels, Figures]]:
    """ReportReads: a reporter id, and at most MAX_REPORTED_READERS readers whose labels are
    short plain words and whose figures are finite and not negative."""
    _label(reporter, "reporter")
    if len(readers) > MAX_REPORTED_READERS:
        raise InvalidArgument(
            f"{len(readers)} readers in one report; the limit is {MAX_REPORTED_READERS}"
        )
    out = []
    for r in readers:
        _label(r.training_job, "training_job")
        name(r.cache)
        if r.path not in PATHS:
            raise InvalidArgument(f"path {shown(r.path, 64)!r} is not one of {', '.join(PATHS)}")
        if r.rank > MAX_RANK:
            raise InvalidArgument(f"rank {r.rank} is above {MAX_RANK}")
        for what in ("chunk_seconds", "stall_seconds"):
            value = getattr(r, what)
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{what} {value} is not a finite number >= 0")
        out.append(
            (
                Labels(r.training_job, str(r.rank), r.cache, r.path),
                Figures(r.elements, r.bytes, r.chunks, r.chunk_seconds, r.stall_seconds),
            )
        )
    return out


def _label(value: str, what: str) -> None:
    if not _LABEL.fullmatch(value):
        raise InvalidArgument(
            f"{what} {shown(value, 64)!r} must be 1-64 of A-Z a-z 0-9 _ . - "
            "(SHARDCACHE_JOB, or CacheClient(job=...))"
        )
