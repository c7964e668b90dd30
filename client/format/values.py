"""Stored values: a record body (or a block of bodies) as it is kept in a shard.

A value wraps the body with a one-byte tag: ``0x01`` + a zstd frame (content
size and checksum on), or ``0x00`` + ``u32`` CRC-32 + the body, used when
compression does not pay. Values travel in chunks framed as little-endian
``u32`` lengths followed by the values back to back. docs/format.md is the
normative description; client/format/codec.py turns elements into bodies and back.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import zstandard

from client.format.codec import RecordError

try:  # ISA-L's CRC-32: zlib's polynomial and values, ~5x faster (docs/benchmarks.md)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without an isal wheel
    from zlib import crc32

TAG_RAW = 0x00
TAG_ZSTD = 0x01
#: Keep the zstd frame only when it is at least this much smaller than the body.
MIN_COMPRESSION_RATIO = 1.25
_CRC = struct.Struct("<I")
#: A raw value's header: its tag and its body's CRC-32.
RAW_HEADER = 1 + _CRC.size
#: A zstd block of at most 128 KiB takes at least 4 bytes (header + RLE byte): no
#: genuine frame decompresses to more than this many times its own size.
MAX_ZSTD_EXPANSION = 32768
#: Frame header descriptor bits that must be clear in our frames: unused, reserved,
#: dictionary id; and the content-checksum bit, which must be set.
_FHD_MUST_BE_CLEAR = 0x10 | 0x08 | 0x03
_FHD_CHECKSUM = 0x04


class Compressor:
    """Turns bodies into stored values (not thread-safe: one per thread).

    Once GIVE_UP records in a row have not compressed well enough, only one in
    PROBE_EVERY is tried until one does: trying costs as much as compressing
    (random float images: ~1 ms per 600 KB record) and is thrown away.
    """

    GIVE_UP = 16
    PROBE_EVERY = 64

    def __init__(self, level: int = 1, min_ratio: float = MIN_COMPRESSION_RATIO) -> None:
        self._min_ratio = min_ratio
        self._zstd = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True
        )
        self._misses = 0
        self._since_probe = 0
        self.attempts = 0  # compressions tried, for tests and stats

    def pack(self, body: Any, compress: bool = True) -> bytes:
        """The stored value of one body (bytes-like)."""
        return self.pack_parts((body,), compress)

    def pack_parts(self, parts: Sequence[Any], compress: bool = True) -> bytes:
        """The stored value of the body parts[0] + parts[1] + ..., joined only once;
        compress=False stores it raw without trying."""
        if not (compress and self.worth_trying()):
            return self.raw(parts)
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        return self.compressed(body) or self.raw((body,))

    def worth_trying(self) -> bool:
        """Whether to try compressing the next body (after GIVE_UP misses in a row, one in
        PROBE_EVERY); False counts towards the next probe."""
        if self._misses >= self.GIVE_UP:
            self._since_probe += 1
            if self._since_probe < self.PROBE_EVERY:
                return False
            self._since_probe = 0
        return True

    def compressed(self, body: Any) -> bytes | None:
        """The zstd value of body when it is at least min_ratio smaller, else None."""
        self.attempts += 1
        frame = self._zstd.compress(body)
        if len(frame) * self._min_ratio <= len(body):
            self._misses = 0
            return b"\x01" + frame
        self._misses += 1
        return None

    @staticmethod
    def raw(parts: Sequence[Any]) -> bytes:
        """The raw value of the body parts[0] + parts[1] + ...: tag, CRC-32, the body."""
        crc = 0
        for part in parts:
            crc = crc32(part, crc)
        return b"".join((b"\x00", _CRC.pack(crc), *parts))  # one copy of the body


def split_chunk(lengths: bytes, data: bytes) -> list[memoryview]:
    """Split a chunk framed as (little-endian u32 lengths, concatenated data)."""
    if len(lengths) % 4:
        raise RecordError(
            f"chunk framing: {len(lengths)} bytes of lengths is not a whole number of u32"
        )
    sizes = np.frombuffer(lengths, "<u4")
    ends = np.cumsum(sizes, dtype=np.int64)
    total = int(ends[-1]) if len(sizes) else 0
    if total != len(data):
        raise RecordError(f"chunk framing: lengths sum to {total}, data has {len(data)}")
    view = memoryview(data)
    starts = (ends - sizes).tolist()
    return [view[s:e] for s, e in zip(starts, ends.tolist())]


def raw_in_place(head: Any, parts: Sequence[Any]) -> bool:
    """Check a value received in pieces where its body belongs (the data plane's receive
    into a batch's rows): head its first RAW_HEADER bytes, parts its body in order, checked
    where they lie. True: a raw value whose CRC-32 matches. False: a zstd frame of the same
    length, to unpack whole. RecordError: a raw value that fails its check, an unknown tag."""
    tag = head[0]
    if tag == TAG_ZSTD:
        return False
    if tag != TAG_RAW:
        raise RecordError(f"unknown record tag 0x{tag:02x}")
    (want,) = _CRC.unpack_from(head, 1)
    crc = 0
    for part in parts:
        crc = crc32(part, crc)
    if crc != want:
        raise RecordError("raw record fails its CRC-32 check")
    return True


def raw_rows(values: Sequence[Any], size: int) -> np.ndarray | None:
    """The bodies of values that are all raw and size bytes long, checked, as the rows of one
    (n, size) view of their join: one join and one comparison of the tags for all, then each
    CRC-32 (a Python step per value, against Decompressor.unpack's several). None when any
    value is of another kind or length: unpack those one by one. A value that fails its
    CRC-32 is a RecordError with ``elements_before`` set (the values before it)."""
    width = RAW_HEADER + size
    if not values or any(len(value) != width for value in values):
        return None
    joined = b"".join(values)
    rows = np.frombuffer(joined, np.uint8).reshape(len(values), width)
    if (rows[:, 0] != TAG_RAW).any():
        return None
    want = np.ascontiguousarray(rows[:, 1:RAW_HEADER]).view("<u4").reshape(-1)
    view = memoryview(joined)
    got = np.fromiter(
        (crc32(view[at + RAW_HEADER : at + width]) for at in range(0, len(joined), width)),
        np.uint32,
        len(values),
    )
    bad = np.flatnonzero(got != want)
    if bad.size:
        exc = RecordError("raw record fails its CRC-32 check")
        exc.elements_before = int(bad[0])  # type: ignore[attr-defined]
        raise exc
    return rows[:, RAW_HEADER:]


class Decompressor:
    """Turns stored values back into bodies, verifying checksums (one per thread)."""

    def __init__(self) -> None:
        self._zstd = zstandard.ZstdDecompressor()

    def unpack(self, value: memoryview | bytes) -> memoryview | bytes:
        """The body of a stored value, checked."""
        return self.unpack_tagged(value)[0]

    def unpack_tagged(self, value: memoryview | bytes) -> tuple[memoryview | bytes, bool]:
        """(the body of a stored value, checked; True when it was a zstd frame)."""
        if len(value) == 0:
            raise RecordError("empty record")
        tag = value[0]
        if tag == TAG_ZSTD:
            return self._unzstd(memoryview(value)[1:]), True
        if tag == TAG_RAW:
            if len(value) < 5:
                raise RecordError("raw record shorter than its header")
            (crc,) = _CRC.unpack_from(value, 1)
            body = value[5:]
            if crc32(body) != crc:
                raise RecordError("raw record fails its CRC-32 check")
            return body, False
        raise RecordError(f"unknown record tag 0x{tag:02x}")

    def _unzstd(self, frame: memoryview) -> bytes:
        """Decompress one frame as Compressor writes it, or raise RecordError.

        Beyond zstd's own checks (content checksum, content size), the frame
        header must declare both, and no bit zstd would ignore may be set; a
        content size no frame of this length can hold is refused before any
        allocation; bytes after the frame are an error.
        """
        try:
            params = zstandard.get_frame_parameters(frame)
        except zstandard.ZstdError as exc:
            raise RecordError(f"zstd frame header is corrupt: {exc}") from exc
        descriptor = frame[4]
        if descriptor & _FHD_MUST_BE_CLEAR or not descriptor & _FHD_CHECKSUM:
            raise RecordError(f"zstd frame header is corrupt: descriptor 0x{descriptor:02x}")
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or size > MAX_ZSTD_EXPANSION * len(frame):
            raise RecordError(
                f"zstd frame header is corrupt: content size {size} for a {len(frame)}-byte frame"
            )
        try:
            if size == 0:  # decompress() would return b"" unchecked: run the decoder
                dobj = self._zstd.decompressobj()
                body = dobj.decompress(frame)
                if not dobj.eof or dobj.unused_data:
                    raise zstandard.ZstdError("frame is truncated or has trailing data")
            else:
                body = self._zstd.decompress(frame, allow_extra_data=False)
        except (zstandard.ZstdError, MemoryError) as exc:
            raise RecordError(f"zstd frame is corrupt: {exc}") from exc
        if len(body) != size:
            raise RecordError(f"zstd frame is corrupt: {len(body)} bytes, header says {size}")
        return body
