"""The gRPC channel to one daemon: connecting, unary calls, error translation."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from cacheserver.v1 import cache_service_pb2 as pb
from cacheserver.v1 import cache_service_pb2_grpc as pb_grpc
from client.errors import ServerUnavailableError, from_rpc_error

T = TypeVar("T")
#: The daemon's address when none is given: the sidecar/DaemonSet manifests set it.
TARGET_ENV = "SHARDCACHE_TARGET"
DEFAULT_TARGET = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 256 << 20


def resolve_target(target: str | None) -> str:
    return target or os.environ.get(TARGET_ENV) or DEFAULT_TARGET


class Transport:
    """Owns the channel and the stub; every call goes through :meth:`call`."""

    def __init__(self, target: str, connect_timeout: float = 5.0) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self._channel = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # a restarted daemon is found within a second (gRPC's default backoff
            # grows to 120 s); reads reconnect mid-epoch (client/_gather.py)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ])
        self.stub = pb_grpc.CacheServiceStub(self._channel)
        self._connected = False

    def connect(self) -> None:
        """Wait (up to connect_timeout) for the daemon, or raise ServerUnavailableError."""
        if self._connected:
            return
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.connect_timeout)
        except grpc.FutureTimeoutError:
            raise ServerUnavailableError(
                f"cannot reach cacheserver at {self.target} within {self.connect_timeout:g}s: "
                "start it with `cacheserver serve --listen ...` or check the target") from None
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


__all__ = ["Transport", "pb", "resolve_target"]
