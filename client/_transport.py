"""The gRPC channel to one daemon: connecting, credentials, unary calls, error translation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc

from client import settings
from client.errors import InvalidArgumentError, ServerUnavailableError, from_rpc_error
from client.wire.limits import MAX_MESSAGE_BYTES
from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

T = TypeVar("T")
Pem = str | Path | bytes


def resolve_target(target: str | None) -> str:
    return target or settings.TARGET.get()


class Transport:
    """Owns the channel and the stub; every call goes through :meth:`call`."""

    def __init__(
        self,
        target: str,
        connect_timeout: float = 5.0,
        *,
        credentials: Credentials | None = None,
        options: list[tuple[str, int]] | None = None,
        wait_connect: bool = True,
    ) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        credentials = credentials or Credentials()
        self.credentials = credentials  # the data plane's TLS too (client/read/fetching/plane.py)
        # a daemon's unix sockets speak no TLS (cacheserver/rpc/server.py): its PEMs are for TCP
        tls = None if target.startswith("unix:") else credentials.tls
        self._tls = tls is not None
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # a restarted daemon is found within a second (gRPC's default backoff
            # grows to 120 s); reads reconnect mid-epoch (client/read/fetching/fetch.py)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            *(options or []),
        ]
        if tls is not None:
            self._channel = grpc.secure_channel(target, tls, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        if credentials.token:
            self._channel = grpc.intercept_channel(self._channel, _BearerToken(credentials.token))
        self.stub = pb_grpc.CacheServiceStub(self._channel)
        # wait_connect=False: calls fail with UNAVAILABLE at once when the daemon refuses
        # the connection, instead of waiting connect_timeout for it (a fleet's next member
        # serves meanwhile, client/_fleet.py)
        self._connected = not wait_connect

    @property
    def channel(self) -> grpc.Channel:
        """The channel, for calls made with their own (de)serializers."""
        return self._channel

    def connect(self) -> None:
        """Wait (up to connect_timeout) for the daemon, or raise ServerUnavailableError."""
        if self._connected:
            return
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.connect_timeout)
        except grpc.FutureTimeoutError:
            raise ServerUnavailableError(
                f"cannot reach cacheserver at {self.target} within {self.connect_timeout:g}s: "
                "start it with `cacheserver serve --listen ...` or check the target"
                + (
                    "; over TLS, also check that tls_ca trusts the daemon's certificate and "
                    "that mutual TLS gets tls_cert/tls_key"
                    if self._tls
                    else ""
                )
            ) from None
        self._connected = True

    def call(self, method: Callable[..., T], request: Any, timeout: float | None = 60) -> T:
        """Run a unary call, translating failures into ShardcacheError subclasses."""
        self.connect()
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err, self.target) from err

    def close(self) -> None:
        self._channel.close()


def _pem(what: str, value: Pem | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    try:
        return Path(value).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {what} {value}: {exc.strerror}") from None


class Credentials(NamedTuple):
    token: str | None = None
    tls: grpc.ChannelCredentials | None = None
    #: The PEMs of tls: CA, client certificate, client key (None: not given).
    pems: tuple[bytes | None, bytes | None, bytes | None] = (None, None, None)

    @classmethod
    def make(
        cls, token: str | None, tls_ca: Pem | None, tls_cert: Pem | None, tls_key: Pem | None
    ) -> Credentials:
        """Token from the argument, else $CACHESERVER_TOKEN; TLS when any PEM is given.

        PEMs are file paths or the PEM bytes themselves (none given: settings.TLS_CA, _CERT,
        _KEY); tls_cert/tls_key are the client's certificate for mutual TLS.
        """
        token = token if token is not None else settings.TOKEN.get()
        if token is not None and (not token.strip() or any(c.isspace() for c in token.strip())):
            raise InvalidArgumentError("token must be non-empty printable text without spaces")
        if tls_ca is None and tls_cert is None and tls_key is None:
            tls_ca, tls_cert, tls_key = (
                s.get() for s in (settings.TLS_CA, settings.TLS_CERT, settings.TLS_KEY)
            )
            if (tls_cert is None) != (tls_key is None):
                raise InvalidArgumentError(
                    "mutual TLS needs both $SHARDCACHE_TLS_CERT and $SHARDCACHE_TLS_KEY: "
                    "set both, or neither"
                )
        if (tls_cert is None) != (tls_key is None):
            raise InvalidArgumentError("mutual TLS needs both tls_cert and tls_key")
        tls = None
        pems = (_pem("tls_ca", tls_ca), _pem("tls_cert", tls_cert), _pem("tls_key", tls_key))
        if tls_ca is not None or tls_cert is not None:
            tls = grpc.ssl_channel_credentials(
                root_certificates=pems[0], private_key=pems[2], certificate_chain=pems[1]
            )
        return cls(token.strip() if token else None, tls, pems)


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> _CallDetails:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)


__all__ = ["Credentials", "Transport", "pb", "resolve_target"]
