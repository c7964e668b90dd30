"""What a call may cost the daemon before and while it is served.

- Message limits per method: control calls take kilobytes, ReadElements its
  indices, WriteCache and StartMaterialize ``--max-message-bytes`` (a chunk of
  records, or one record larger than a chunk, which the client sends alone;
  a shipped pipeline's graph). A larger message is RESOURCE_EXHAUSTED and is
  never parsed. grpc itself receives no message above the largest of these
  (:func:`receive_limit`), and the interceptor refuses a call without the
  token before its message is received at all.
- Threads: unary calls (health checks, GetCache, ...) run on a pool of their
  own (:data:`CONTROL_WORKERS`), so streams, however many and however slow
  their readers, never hold the threads those calls need.
- Idle streams: a stream whose reader takes no message for
  ``--stream-idle-timeout`` seconds is ended with UNAVAILABLE (the client
  library resumes a read where it stopped), freeing its thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from cacheserver.logs import shown
from client.wire.status import CacheServerError, InvalidArgument, MessageTooLarge

log = logging.getLogger(__name__)

#: Threads serving unary calls (health, GetCache, leases, ...), apart from the streams'.
CONTROL_WORKERS = 16
#: A control request: a name (at most 200 characters), a few numbers.
CONTROL_MESSAGE_BYTES = 64 << 10
#: ReadElements: up to MAX_INDICES (65536, client/wire/limits.py) indices of 8 bytes and a name.
READ_ELEMENTS_MESSAGE_BYTES = 1 << 20
#: A WriteCacheRequest's framing around its records (tags, lengths, the u32 length table
#: of a chunk is counted in --max-message-bytes).
FRAMING_BYTES = 64 << 10
#: Methods whose messages may be as large as --max-message-bytes (plus framing).
_DATA_METHODS = frozenset({"WriteCache", "StartMaterialize"})


def receive_limit(max_message_bytes: int) -> int:
    """grpc.max_receive_message_length: the largest message any method accepts."""
    return max(max_message_bytes + FRAMING_BYTES, READ_ELEMENTS_MESSAGE_BYTES)


def request_limit(method: str, max_message_bytes: int) -> int:
    """Bytes one request message of method ('/pkg.Service/Name' or 'Name') may have."""
    short = method.rsplit("/", 1)[-1]
    if short in _DATA_METHODS:
        return receive_limit(max_message_bytes)
    if short == "ReadElements":
        return READ_ELEMENTS_MESSAGE_BYTES
    return CONTROL_MESSAGE_BYTES


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB"


class Refused:
    """A request message the call will not take, in place of the parsed message: the
    call raises error. Raised inside grpc's deserializer it would be INTERNAL with a
    traceback in the log."""

    def __init__(self, error: CacheServerError) -> None:
        self.error = error


def checked(
    deserialize: Callable[[bytes], Any] | None, method: str, limit: int = 0
) -> Callable[[bytes], Any] | None:
    """deserialize, but a message over limit bytes (0: no limit) becomes, unparsed, a
    Refused MessageTooLarge, and one that does not parse a Refused InvalidArgument."""
    if deserialize is None:
        return None
    short = method.rsplit("/", 1)[-1]
    hint = (
        "raise the daemon's --max-message-bytes or send smaller records"
        if short in _DATA_METHODS
        else "no valid request is that large"
    )

    def parse(data: bytes) -> Any:
        if limit and len(data) > limit:
            return Refused(
                MessageTooLarge(
                    f"a {short} request of {len(data):,} bytes is larger than the "
                    f"{_size(limit)} it accepts; {hint}"
                )
            )
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError, bad UTF-8, a framing error: the caller's
            return Refused(
                InvalidArgument(
                    "the request is not a valid message of the method's request type: "
                    + shown(f"{type(exc).__name__}: {exc}", 300)
                )
            )

    return parse


def accepted(request: Any) -> Any:
    """request, unless checked() refused it: its error is raised."""
    if isinstance(request, Refused):
        raise request.error
    return request


def end_stream(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End a call from outside its handler's thread, with a status the client sees."""
    context.set_code(code)  # for the request log line
    context.set_details(details)
    # grpcio offers no public way to end another thread's call with a status:
    # context.cancel() would say only CANCELLED. The core's cancel-with-status sends
    # the status in the trailers (they are not subject to flow control).
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        context.cancel()


class IdleStreams:
    """Ends response streams whose reader took no message for timeout seconds.

    A handler marks its call waiting() when it hands grpc a message and busy()
    when grpc asks for the next one (the previous one went out); grpc's
    flow control blocks the handler's thread in between while the reader does
    not read. One thread looks every quarter of the timeout (at most 1s).
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[float, grpc.ServicerContext, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.timeout > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="idle-streams", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def waiting(self, context: grpc.ServicerContext, method: str) -> None:
        with self._lock:
            self._waiting[id(context)] = (time.monotonic(), context, method)

    def busy(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self._waiting.pop(id(context), None)

    def _run(self) -> None:
        while not self._stop.wait(min(self.timeout / 4, 1.0)):
            now = time.monotonic()
            with self._lock:
                idle = [
                    (k, ctx, m)
                    for k, (since, ctx, m) in self._waiting.items()
                    if now - since > self.timeout
                ]
                for k, _, _ in idle:
                    del self._waiting[k]
            for _, context, method in idle:
                short = method.rsplit("/", 1)[-1]
                details = (
                    f"{short} stream idle for {self.timeout:g}s: the client took no "
                    "message (the daemon's --stream-idle-timeout), so the daemon ended "
                    "the stream to free its thread; read again to resume (the client "
                    "library resumes where it stopped)"
                )
                log.warning(
                    "ended a %s stream of %s: its reader took nothing for %gs "
                    "(--stream-idle-timeout)",
                    short,
                    context.peer(),
                    self.timeout,
                )
                end_stream(context, grpc.StatusCode.UNAVAILABLE, details)
