"""The protocol's limits: what the daemon and the client must agree on, each defined once.

Both edges import these. The daemon refuses a request past a limit where it enters
(cacheserver/rpc/validate.py for gRPC, cacheserver/plane/server.py for the data plane);
the client cuts its requests to stay within them. Limits only one edge has (a cache
name's length, a fingerprint's, --max-message-bytes as configured) live with that edge.
"""

from __future__ import annotations

from client.wire.status import InvalidArgument

#: Most global indices one ReadElements request (or data-plane ELEMENTS request) names.
MAX_INDICES = 65536

#: Bytes of records per chunk when a request leaves chunk_bytes at 0.
DEFAULT_CHUNK_BYTES = 1 << 20
#: The bounds a request's chunk_bytes is clamped to (client/wire/chunks.py chunk_size).
MIN_CHUNK_BYTES = 4 << 10
MAX_CHUNK_BYTES = 16 << 20

#: The largest gRPC message: the client channel's send and receive limit, and the default
#: of the daemon's --max-message-bytes (the largest record a WriteCache message carries).
MAX_MESSAGE_BYTES = 256 << 20

#: Most readers one ReportReads request carries (the client sends more in several).
MAX_REPORTED_READERS = 64
#: The highest rank a reader may report.
MAX_RANK = 1 << 20
#: What a reported training job (and reporter id) may be: 1-64 of A-Z a-z 0-9 _ . -
LABEL_PATTERN = r"[A-Za-z0-9_.-]{1,64}"

#: Most bytes of a data-plane ticket (the daemon issues 32).
MAX_TICKET = 64
#: Most bytes one data-plane ERROR frame's text may have; a longer one is cut.
MAX_ERROR_TEXT = 4096


def check_indices(n: int) -> None:
    """Refuse a request naming more than MAX_INDICES indices."""
    if n > MAX_INDICES:
        raise InvalidArgument(
            f"{n} indices in one ReadElements request; the limit is "
            f"{MAX_INDICES}: split the request"
        )
