"""Operation snapshots (cacheserver.materialize.materializer) as cacheserver.v1 messages."""

from __future__ import annotations

from cacheserver.materialize.operation import OperationError, Snapshot
from client.wire.v1 import cache_service_pb2 as pb

_STATES = {
    "RUNNING": pb.OPERATION_STATE_RUNNING,
    "SUCCEEDED": pb.OPERATION_STATE_SUCCEEDED,
    "FAILED": pb.OPERATION_STATE_FAILED,
    "CANCELLED": pb.OPERATION_STATE_CANCELLED,
}


def error_to_proto(error: OperationError) -> pb.OperationError:
    return pb.OperationError(
        code=error.code.value[0], reason=error.reason, message=error.message, shard=error.shard
    )


def operation_to_proto(snap: Snapshot) -> pb.Operation:
    op = pb.Operation(
        name=snap.name,
        done=snap.done,
        state=_STATES[snap.state],
        cache=snap.cache,
        shards_total=snap.shards_total,
        shards_done=snap.shards_done,
        shards_resumed=snap.shards_resumed,
        elements=snap.elements,
        raw_bytes=snap.raw_bytes,
        stored_bytes=snap.stored_bytes,
        bytes_per_second=snap.bytes_per_second,
        elements_per_second=snap.elements_per_second,
        eta_seconds=snap.eta_seconds,
        start_time=snap.start_time,
        end_time=snap.end_time,
        workers=snap.workers,
        shard_errors=[error_to_proto(e) for e in snap.shard_errors],
    )
    if snap.error is not None:
        op.error.CopyFrom(error_to_proto(snap.error))
    return op
