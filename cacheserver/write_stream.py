"""The WriteCache method's handler, reading chunks without protobuf's copies.

Registered ahead of the generated servicer registration, so that WriteCache
requests are decoded by client/write_wire.py's decode_request (a chunk's data
stays a view into the received message) while every other method keeps the
generated handlers. The servicer method itself is CacheService.WriteCache.
"""

from __future__ import annotations

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
