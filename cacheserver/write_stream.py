"""The WriteCache method's handler, reading chunks without protobuf's copies.

Registered ahead of the generated servicer registration, so that WriteCache
requests are decoded by client/write_wire.py's decode_request (a chunk's data
stays a view into the received message) while every other method keeps the
generated handlers. The servicer method itself is CacheService.WriteCache.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc

from cacheserver.v1 import cache_service_pb2 as pb
from client.write_wire import decode_request

SERVICE = "cacheserver.v1.CacheService"


def write_cache_handler(service: Any) -> grpc.GenericRpcHandler:
    """A generic handler answering WriteCache only, with service.WriteCache."""
    return grpc.method_handlers_generic_handler(SERVICE, {
        "WriteCache": grpc.stream_stream_rpc_method_handler(
            service.WriteCache, request_deserializer=decode_request,
            response_serializer=pb.WriteCacheResponse.SerializeToString),
    })


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
