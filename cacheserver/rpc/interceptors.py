"""Cross-cutting rules every call passes through: auth, stream limits, request log, metrics.

One gRPC server interceptor wraps every method handler:

- who calls: when the daemon has credentials (``--auth-file``,
  ``--auth-token-file``), every call but ``grpc.health.v1.Health/*`` must name
  a principal, by ``authorization: Bearer <token>`` or its mutual-TLS client
  certificate (rpc/callers.py); otherwise UNAUTHENTICATED. A call refused from
  its headers gets a handler that never receives its message
  (rpc/admission.py), so its body costs the daemon nothing. What the principal
  may do, the service asks cacheserver/access.py.
- audit: one line on the ``cacheserver.audit`` logger per state-changing call
  (principal, verb, cache, method, result).
- streams per client: at most ``max_streams_per_client`` streaming calls per
  client host at once (every unix-socket client is the same peer "unix:"),
  and at most ``max_streams`` in all.
- message limits per method, unary calls on a pool of their own, idle streams
  ended: rpc/admission.py.
- one log line per call outcome on the ``cacheserver.requests`` logger (health
  checks at DEBUG, the rest at INFO), with
  the fields method, cache, code, duration_seconds, bytes and peer (each a
  JSON key under ``--log-format json``), plus duration/error/stream metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from cacheserver import access, metrics
from cacheserver.access import Authority, Principal, Verb
from cacheserver.logs import shown
from cacheserver.rpc import admission
from cacheserver.rpc.callers import Callers
from client.wire.chunks import read_shard_data_bytes
from client.wire.status import REASON_KEY, CacheServerError, TooManyStreams, Unauthenticated

log = logging.getLogger("cacheserver.requests")
HEALTH_PREFIX = "/grpc.health.v1.Health/"
_STREAM_KIND = {"ReadShard": "read", "WriteCache": "write"}
#: The calls that change state, audited with the verb they need.
AUDITED = {
    "WriteCache": Verb.WRITE,
    "StartMaterialize": Verb.WRITE,
    "CancelOperation": Verb.WRITE,
    "DeleteCache": Verb.ADMIN,
    "SetCacheRetention": Verb.ADMIN,
}


def _peer_host(peer: str) -> str:
    """'ipv4:10.0.0.7:51234' -> 'ipv4:10.0.0.7'; 'unix:...' stays as is."""
    return peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer


def _deny(context: grpc.ServicerContext, exc: CacheServerError) -> None:
    context.set_trailing_metadata(((REASON_KEY, exc.reason),))
    context.abort(exc.code, str(exc))


class _Call:
    """Bookkeeping of one call: its cache, bytes, outcome; logs and counts at the end."""

    def __init__(self, method: str, context: grpc.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.cache = ""
        self.bytes = 0
        self.start = time.monotonic()
        self.principal: Principal | None = None

    def see_request(self, request: Any) -> None:
        name = getattr(request, "name", None)
        if isinstance(name, str) and name:
            self.cache = shown(name)
        which = (
            request.WhichOneof("request")
            if hasattr(request, "WhichOneof") and "request" in request.DESCRIPTOR.oneofs_by_name
            else None
        )
        if which == "begin":
            self.cache = shown(request.begin.name)
        elif which == "chunk":
            self.bytes += len(request.chunk.data)

    def see_response(self, response: Any) -> None:
        if isinstance(response, bytes):  # a serialized ReadShardResponse (rpc/streams.py)
            self.bytes += read_shard_data_bytes(response)
            return
        data = getattr(response, "data", None)
        if isinstance(data, bytes):
            self.bytes += len(data)

    def end(self, failed: BaseException | None) -> None:
        code = self.context.code()  # set by abort(); None when the handler returned
        if code is None:
            if failed is not None and not isinstance(failed, GeneratorExit):
                code = grpc.StatusCode.UNKNOWN
            elif not self.context.is_active() and failed is not None:
                code = grpc.StatusCode.CANCELLED
            else:
                code = grpc.StatusCode.OK
        duration = time.monotonic() - self.start
        short = self.method.rsplit("/", 1)[-1]
        metrics.RPC_DURATION.labels(short).observe(duration)
        if code != grpc.StatusCode.OK:
            metrics.RPC_ERRORS.labels(short, code.name).inc()
        fields = {
            "method": short,
            "cache": self.cache,
            "code": code.name,
            "duration_seconds": round(duration, 6),
            "bytes": self.bytes,
            "peer": self.context.peer(),
        }
        if self.principal is not None:
            fields["principal"] = self.principal.name
        level = logging.DEBUG if self.method.startswith(HEALTH_PREFIX) else logging.INFO
        log.log(
            level,
            "%s cache=%s code=%s %.3fs %d bytes",
            short,
            self.cache or "-",
            code.name,
            duration,
            self.bytes,
            extra={"fields": fields},
        )
        if short in AUDITED and self.method.startswith("/cacheserver."):
            access.audit(
                self.principal.name if self.principal else "-",
                AUDITED[short],
                self.cache,
                short,
                code.name,
            )


class ServerInterceptor(grpc.ServerInterceptor):
    def __init__(
        self,
        callers: Callers | None = None,
        max_streams_per_client: int = 0,
        *,
        max_streams: int = 0,
        max_message_bytes: int = 0,
        control_pool: Any = None,
        idle: admission.IdleStreams | None = None,
    ) -> None:
        self.callers = callers or Callers(Authority(None))
        self._max_streams = max_streams_per_client
        self._max_total = max_streams or max_streams_per_client
        self._max_message_bytes = max_message_bytes
        self._control_pool = control_pool
        self._idle_streams = idle
        self._lock = threading.Lock()
        self._streams: Counter[str] = Counter()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every call's handler has returned and logged; False on timeout.

        grpc's server.stop() returns once calls are done or cancelled on the wire,
        while cancelled handlers may still be unwinding in their threads.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def _track(self, delta: int) -> None:
        with self._idle:
            self._in_flight += delta
            if not self._in_flight:
                self._idle.notify_all()

    def _caller(self, details: grpc.HandlerCallDetails) -> tuple[Principal | None, bool]:
        """(principal, final) from the headers (rpc/callers.py); health is anyone's."""
        if details.method.startswith(HEALTH_PREFIX):
            return access.ANYONE, True
        return self.callers.from_headers(details.invocation_metadata)

    def _enter_stream(self, context: grpc.ServicerContext) -> str:
        peer = _peer_host(context.peer())
        with self._lock:
            total, held = sum(self._streams.values()), self._streams[peer]
            full = total >= self._max_total
            peer_full = held >= self._max_streams
            if not (full or peer_full):
                self._streams[peer] += 1
        if full:
            _deny(
                context,
                TooManyStreams(
                    f"the daemon already serves {total} streams, its --max-streams; retry later "
                    "or read fewer shards at once"
                ),
            )
        if peer_full:
            _deny(
                context,
                TooManyStreams(
                    f"{peer} already holds {held} streams, the daemon's --max-streams-per-client; "
                    "read fewer shards at once or wait for streams to finish"
                ),
            )
        return peer

    def _leave_stream(self, peer: str) -> None:
        with self._lock:
            self._streams[peer] -= 1
            if not self._streams[peer]:
                del self._streams[peer]

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        principal, final = self._caller(details)
        authorized = principal is not None or not final
        callers = self.callers
        limited = (
            self._max_streams > 0
            and not method.startswith(HEALTH_PREFIX)
            and (handler.request_streaming or handler.response_streaming)
        )
        kind = _STREAM_KIND.get(method.rsplit("/", 1)[-1])
        interceptor = self
        idle = self._idle_streams

        def guard(context: grpc.ServicerContext, call: _Call) -> None:
            caller = principal if final else callers.from_certificate(context)
            if caller is None:
                _deny(
                    context,
                    Unauthenticated(
                        "this daemon requires a bearer token or a client certificate it knows "
                        f"(for {method}); pass CacheClient(token=...) or set CACHESERVER_TOKEN "
                        "(the wrong token gets this too)"
                    ),
                )
                return
            call.principal = caller
            callers.bind(context, caller)

        def stream(
            inner: Callable[..., Iterator[Any]],
            request: Any,
            context: grpc.ServicerContext,
            streaming_request: bool,
        ) -> Iterator[Any]:
            interceptor._track(+1)
            call = _Call(method, context)
            failed: BaseException | None = None
            peer = None
            if kind:
                metrics.ACTIVE_STREAMS.labels(kind).inc()
            try:
                guard(context, call)
                if limited:
                    peer = interceptor._enter_stream(context)
                request = parsed(request, context)
                if streaming_request:
                    request = _observed(request, call)
                else:
                    call.see_request(request)
                for response in inner(request, context):
                    call.see_response(response)
                    if idle is not None:
                        idle.waiting(context, method)
                    yield response  # blocks while the reader does not read
                    if idle is not None:
                        idle.busy(context)
            except BaseException as exc:
                failed = exc
                raise
            finally:
                if idle is not None:
                    idle.busy(context)
                if peer is not None:
                    interceptor._leave_stream(peer)
                if kind:
                    metrics.ACTIVE_STREAMS.labels(kind).dec()
                callers.unbind(context)
                call.end(failed)
                interceptor._track(-1)

        def unary(
            inner: Callable[..., Any],
            request: Any,
            context: grpc.ServicerContext,
            streaming_request: bool,
        ) -> Any:
            interceptor._track(+1)
            call = _Call(method, context)
            failed: BaseException | None = None
            try:
                guard(context, call)
                request = parsed(request, context)
                if streaming_request:
                    request = _observed(request, call)
                else:
                    call.see_request(request)
                return inner(request, context)
            except BaseException as exc:
                failed = exc
                raise
            finally:
                callers.unbind(context)
                call.end(failed)
                interceptor._track(-1)

        if not authorized:  # refused before its message is received (rpc/admission.py)
            return _pooled(
                grpc.stream_unary_rpc_method_handler(lambda r, c: unary(_never_called, r, c, True)),
                self._control_pool,
            )
        limit = (
            admission.request_limit(method, self._max_message_bytes)
            if self._max_message_bytes
            else 0
        )
        handler = handler._replace(
            request_deserializer=admission.checked(handler.request_deserializer, method, limit)
        )
        return _pooled(_rebuild(handler, stream, unary), self._control_pool)


def parsed(request: Any, context: grpc.ServicerContext) -> Any:
    """A request admission.checked() refused ends the call with its error."""
    try:
        return admission.accepted(request)
    except CacheServerError as exc:
        _deny(context, exc)


def _observed(requests: Iterator[Any], call: _Call) -> Iterator[Any]:
    for request in requests:
        call.see_request(request)
        # raised in the handler, which translates it
        yield admission.accepted(request)


def _rebuild(handler: Any, stream: Callable[..., Any], unary: Callable[..., Any]) -> Any:
    """The same handler with its behaviour wrapped by stream/unary."""
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        inner = handler.unary_unary
        return grpc.unary_unary_rpc_method_handler(lambda r, c: unary(inner, r, c, False), **kw)
    if handler.stream_unary:
        inner = handler.stream_unary
        return grpc.stream_unary_rpc_method_handler(lambda r, c: unary(inner, r, c, True), **kw)
    if handler.unary_stream:
        inner = handler.unary_stream
        return grpc.unary_stream_rpc_method_handler(lambda r, c: stream(inner, r, c, False), **kw)
    inner = handler.stream_stream
    return grpc.stream_stream_rpc_method_handler(lambda r, c: stream(inner, r, c, True), **kw)


def _never_called(request: Any, context: grpc.ServicerContext) -> Any:
    raise AssertionError("an unauthenticated call reached its handler")


def _pooled(handler: Any, pool: Any) -> Any:
    """Unary calls run on pool (the streams' threads cannot starve them)."""
    if pool is not None and not handler.response_streaming:
        behavior = handler.unary_unary or handler.stream_unary
        behavior.experimental_thread_pool = pool
    return handler
