"""What the object store is asked: requests by kind and bytes by direction, as a bill counts them.

:class:`StoreRequests` hooks a boto3 S3 client's events, so that every HTTP request the
client sends is counted, retries included, whoever made it (the tier's calls and the
transfer manager's threads alike):

* ``before-parameter-build`` reads the call's key (``Key``, ``Prefix``, or the first key
  of a ``DeleteObjects``) and notes in the call's context which cache it is for: the first
  component of the key below the store's prefix (cacheserver/catalog/stored.py);
* ``request-created``, once per attempt, counts the request by kind and its body's bytes
  (``out``);
* ``response-received``, once per attempt, counts the bytes the answer declares
  (``Content-Length``: ``in``); an attempt that got no answer counts none.

Kinds follow the store's price list, not the HTTP method: ``LIST`` (ListObjectsV2 is a
GET), ``HEAD``, ``GET``, ``DELETE`` (DeleteObjects is a POST; AbortMultipartUpload), and
``PUT`` for everything that writes (PutObject, CreateMultipartUpload, UploadPart,
CompleteMultipartUpload).

The daemon's totals go to /metrics (``shardcache_store_requests_total{op}``,
``shardcache_store_bytes_total{direction}``); the tallies per cache are kept in memory
for ``cacheserver info NAME``, for the ``MAX_CACHES`` caches most recently used (a
label per cache name would make the metric's series unbounded).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cacheserver import metrics

OPS = ("GET", "PUT", "HEAD", "LIST", "DELETE")
#: Per-cache tallies kept (the least recently counted dropped first).
MAX_CACHES = 4096
_CONTEXT_KEY = "shardcache_cache"


@dataclass
class Tally:
    """Requests by kind and bytes by direction, of one cache (or of the daemon)."""

    requests: dict[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0

    def copy(self) -> Tally:
        return Tally(dict(self.requests), self.bytes_in, self.bytes_out)


def op_kind(operation: str) -> str:
    """The price-list kind of an S3 operation name (GetObject -> GET, ListObjectsV2 -> LIST)."""
    for prefix, kind in (
        ("List", "LIST"),
        ("Head", "HEAD"),
        ("Get", "GET"),
        ("Delete", "DELETE"),
        ("Abort", "DELETE"),
    ):
        if operation.startswith(prefix):
            return kind
    return "PUT"


class StoreRequests:
    """Counts one bucket prefix's requests (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = f"{prefix}/" if prefix else ""
        self._lock = threading.Lock()
        self._caches: OrderedDict[str, Tally] = OrderedDict()

    def attach(self, client: Any) -> None:
        """Register the hooks on a boto3 S3 client."""
        events = client.meta.events
        events.register("before-parameter-build.s3", self._before_build)
        events.register("request-created.s3", self._created)
        events.register("response-received.s3", self._received)

    def of(self, cache: str) -> Tally:
        """The tally of one cache since the daemon started (empty when none was counted)."""
        with self._lock:
            tally = self._caches.get(cache)
            return tally.copy() if tally is not None else Tally()

    def cache_of(self, key: str) -> str:
        """The cache a key (with the store's prefix) belongs to; "" for none."""
        if not key.startswith(self._prefix):
            return ""
        name, sep, _ = key[len(self._prefix) :].partition("/")
        return name if sep else ""

    # ------------------------------------------------------------------ the hooks

    def _before_build(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        key = params.get("Key") or params.get("Prefix") or ""
        if not key and isinstance(params.get("Delete"), dict):
            objects = params["Delete"].get("Objects") or [{}]
            key = objects[0].get("Key", "")
        context[_CONTEXT_KEY] = self.cache_of(key) if isinstance(key, str) else ""

    def _created(self, request: Any, operation_name: str, **_: Any) -> None:
        kind = op_kind(operation_name)
        sent = _body_bytes(request)
        metrics.STORE_REQUESTS.labels(kind).inc()
        if sent:
            metrics.STORE_BYTES.labels("out").inc(sent)
        cache = (getattr(request, "context", None) or {}).get(_CONTEXT_KEY, "")
        if cache:
            with self._lock:
                tally = self._tally(cache)
                tally.requests[kind] = tally.requests.get(kind, 0) + 1
                tally.bytes_out += sent

    def _received(
        self, response_dict: dict[str, Any] | None, context: dict[str, Any], **_: Any
    ) -> None:
        if not response_dict:
            return
        try:
            got = int(response_dict.get("headers", {}).get("content-length", 0))
        except (TypeError, ValueError):
            return
        if got <= 0:
            return
        metrics.STORE_BYTES.labels("in").inc(got)
        cache = (context or {}).get(_CONTEXT_KEY, "")
        if cache:
            with self._lock:
                self._tally(cache).bytes_in += got

    def _tally(self, cache: str) -> Tally:  # under the lock
        tally = self._caches.get(cache)
        if tally is None:
            tally = self._caches[cache] = Tally()
            while len(self._caches) > MAX_CACHES:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(cache)
        return tally


def _body_bytes(request: Any) -> int:
    """Bytes of a request's body: its Content-Length, else the length of what it holds."""
    headers = getattr(request, "headers", {}) or {}
    for header in ("X-Amz-Decoded-Content-Length", "Content-Length"):
        value = headers.get(header)
        if value is not None and str(value).isdigit():
            return int(value)
    body = getattr(request, "data", None)
    if isinstance(body, bytes | bytearray):
        return len(body)
    if body is None or isinstance(body, dict | str):
        return len(body or "")
    from botocore.utils import determine_content_length

    try:
        return int(determine_content_length(body) or 0)
    except (OSError, TypeError, ValueError):
        return 0
