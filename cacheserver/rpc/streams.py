"""The WriteCache and ReadShard handlers, moving chunks without protobuf's copies.

Registered over the generated servicer registration, so that WriteCache
requests are decoded by client/wire/chunks.py's decode_request (a chunk's data
stays a view into the received message) and ReadShard's responses, which
CacheService.ReadShard frames itself (encode_read_shard_response), go out as
they are; every other method keeps the generated handlers. The servicer
methods themselves are CacheService.WriteCache and CacheService.ReadShard.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc

from client.wire.chunks import decode_request, serialize_request
from client.wire.v1 import cache_service_pb2 as pb


def wire_handlers(service: Any) -> dict[str, grpc.RpcMethodHandler]:
    """WriteCache's and ReadShard's handlers, with service's methods.

    grpcio resolves a method registered with add_registered_method_handlers (as
    the generated code registers every method) before any generic handler, and a
    later registration of a method replaces an earlier one: register these after
    the generated ones.
    """
    return {
        "WriteCache": grpc.stream_stream_rpc_method_handler(
            service.WriteCache,
            request_deserializer=decode_request,
            response_serializer=pb.WriteCacheResponse.SerializeToString,
        ),
        "ReadShard": grpc.unary_stream_rpc_method_handler(
            service.ReadShard,
            request_deserializer=pb.ReadShardRequest.FromString,
            response_serializer=serialize_request,
        ),
    }


class BegunGuard:
    """Discards a write whose stream ended while the handler waited at its first yield.

    gRPC stops iterating a handler's responses when the caller cancels, and a
    generator suspended at a yield runs its finally only when it is closed or
    collected, which may be never (seen: a cancelled WriteCache left its cache
    WRITING until restart). An RPC callback aborts the session unless the
    handler resumed first; the handler asks resumed() after the yield.
    """

    def __init__(self, session: Any, context: grpc.ServicerContext) -> None:
        self._session = session
        self._lock = threading.Lock()
        self._resumed = self._aborted = False
        if not context.add_callback(self._rpc_done):
            self._rpc_done()  # the RPC is over already

    def _rpc_done(self) -> None:
        with self._lock:
            if self._resumed:
                return
            self._aborted = True
        self._session.abort()

    def resumed(self) -> bool:
        """False when the callback aborted the session: the handler must stop."""
        with self._lock:
            self._resumed = not self._aborted
            return self._resumed
