"""The client's exceptions, one per failure a caller can act on.

Every error the daemon sends carries a gRPC status code and a reason
(``shardcache-reason`` trailing metadata), both defined once in
:mod:`client.wire.status`; :func:`from_rpc_error` maps the pair to one of these
classes. Catch :class:`ShardcacheError` for all of them.
"""

from __future__ import annotations

import grpc

from client.wire import status
from client.wire.status import REASON_KEY


class ShardcacheError(Exception):
    """Base of every exception the client raises."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    reason = "UNKNOWN"


class ServerUnavailableError(ShardcacheError):
    """The daemon cannot be reached (not running, wrong target, shutting down)."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


class InvalidArgumentError(ShardcacheError, ValueError):
    """A request was malformed: bad cache name, bad option, unsupported element."""

    code, reason = status.InvalidArgument.code, status.InvalidArgument.reason


class CacheNotFoundError(ShardcacheError, KeyError):
    """No cache of that name exists on the daemon."""

    code, reason = status.CacheNotFound.code, status.CacheNotFound.reason

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CacheNotReadyError(ShardcacheError):
    """The cache is still being written; wait until it is READY."""

    code, reason = status.CacheWriting.code, status.CacheWriting.reason


class FingerprintMismatchError(ShardcacheError):
    """The cache of that name was produced by a different pipeline or version."""

    code, reason = status.FingerprintMismatch.code, status.FingerprintMismatch.reason


class DiskFullError(ShardcacheError):
    """The daemon's disk is full; free space or delete caches."""

    code, reason = status.DiskFull.code, status.DiskFull.reason


class DataLossError(ShardcacheError):
    """Stored data is corrupt (checksum mismatch, damaged LMDB file)."""

    code, reason = status.DataLoss.code, status.DataLoss.reason


class InternalError(ShardcacheError):
    """The daemon failed unexpectedly; its log says more."""

    code, reason = status.CacheServerError.code, status.CacheServerError.reason


_BY_REASON: dict[str, type[ShardcacheError]] = {
    cls.reason: cls
    for cls in (
        ServerUnavailableError,
        InvalidArgumentError,
        CacheNotFoundError,
        CacheNotReadyError,
        FingerprintMismatchError,
        DiskFullError,
        DataLossError,
        InternalError,
    )
}
_BY_CODE = {
    grpc.StatusCode.UNAVAILABLE: ServerUnavailableError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: CacheNotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: CacheNotReadyError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: DiskFullError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
}


def from_rpc_error(err: grpc.RpcError, target: str) -> ShardcacheError:
    """Translate a failed call into the matching ShardcacheError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    reason = ""
    if hasattr(err, "trailing_metadata"):
        for key, value in err.trailing_metadata() or ():
            if key == REASON_KEY:
                reason = value
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, ShardcacheError)
    if code == grpc.StatusCode.UNAVAILABLE and not reason:
        return ServerUnavailableError(
            f"cannot reach cacheserver at {target}: {details}; is `cacheserver serve` "
            "running and listening there?"
        )
    return cls(details)


class CapacityExceededError(DiskFullError):
    """The daemon's --max-bytes / --min-free-bytes leave no room, even after evicting."""

    code, reason = status.CapacityExceeded.code, status.CapacityExceeded.reason


class TooManyStreamsError(ShardcacheError):
    """This host already holds as many streams as the daemon allows one client."""

    code, reason = status.TooManyStreams.code, status.TooManyStreams.reason


class MessageTooLargeError(ShardcacheError):
    """A request was larger than the daemon accepts for its method (--max-message-bytes
    for writes and shipped pipelines)."""

    code, reason = status.MessageTooLarge.code, status.MessageTooLarge.reason


class UnauthenticatedError(ShardcacheError):
    """The daemon wants a bearer token: pass token= or set CACHESERVER_TOKEN."""

    code, reason = status.Unauthenticated.code, status.Unauthenticated.reason


class PermissionDeniedError(ShardcacheError, PermissionError):
    """The daemon knows who the caller is, and its grants do not allow this verb on this
    cache; the message names the principal, the verb and the cache."""

    code, reason = status.PermissionDenied.code, status.PermissionDenied.reason


class StoreUnavailableError(ServerUnavailableError):
    """The cache is in the daemon's object store, which the daemon cannot reach now; reads
    retry it like any UNAVAILABLE."""

    code, reason = status.StoreUnavailable.code, status.StoreUnavailable.reason


_BY_REASON.update(
    {
        cls.reason: cls
        for cls in (
            CapacityExceededError,
            TooManyStreamsError,
            MessageTooLargeError,
            UnauthenticatedError,
            StoreUnavailableError,
            PermissionDeniedError,
        )
    }
)
_BY_CODE[grpc.StatusCode.UNAUTHENTICATED] = UnauthenticatedError
_BY_CODE[grpc.StatusCode.PERMISSION_DENIED] = PermissionDeniedError


class CacheExistsError(ShardcacheError):
    """A READY cache already has that name; pass overwrite=True to replace it."""

    code, reason = status.CacheExists.code, status.CacheExists.reason


class OperationNotFoundError(ShardcacheError, KeyError):
    """No operation of that name is known to the daemon."""

    code, reason = status.OperationNotFound.code, status.OperationNotFound.reason

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class PipelineError(ShardcacheError):
    """The pipeline raised while the daemon materialized it; the message is its own."""

    code, reason = status.PipelineFailed.code, status.PipelineFailed.reason


class OperationCancelledError(ShardcacheError):
    """The operation was cancelled before it finished."""

    code, reason = status.OperationCancelled.code, status.OperationCancelled.reason


class MaterializeNotAllowedError(ShardcacheError):
    """The daemon's operator has not allowed this entry point or shipped pipelines;
    the message names the `cacheserver serve` setting that would."""

    code, reason = status.MaterializeNotAllowed.code, status.MaterializeNotAllowed.reason


_MATERIALIZE_ERRORS: tuple[type[ShardcacheError], ...] = (
    CacheExistsError,
    OperationNotFoundError,
    PipelineError,
    OperationCancelledError,
    MaterializeNotAllowedError,
)
_BY_REASON.update({cls.reason: cls for cls in _MATERIALIZE_ERRORS})  # type: ignore[misc]
_BY_CODE[grpc.StatusCode.ALREADY_EXISTS] = CacheExistsError
_BY_CODE[grpc.StatusCode.CANCELLED] = OperationCancelledError


class ReconnectTimeoutError(ServerUnavailableError):
    """The daemon went away mid-epoch and did not come back within reconnect_timeout."""

    reason = "RECONNECT_TIMEOUT"  # raised by the client itself, never sent by the daemon


class ResumeMismatchError(ShardcacheError, ValueError):
    """A ReadState does not fit this read: another cache, seed, order or worker split."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "RESUME_MISMATCH"  # raised by the client itself, never sent by the daemon


class LeaseNotFoundError(ShardcacheError, KeyError):
    """A direct read lease expired (not renewed within its TTL) or was released."""

    code, reason = status.LeaseNotFound.code, status.LeaseNotFound.reason

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DirectReadUnavailableError(ShardcacheError):
    """direct=True, but this process cannot read the daemon's files (another host, a
    data dir mounted elsewhere or not at all, permissions); the message says which."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "DIRECT_READ_UNAVAILABLE"  # raised by the client itself, never sent by the daemon


class TooManyHoldsError(ShardcacheError):
    """A read lease holds as many streamed shards at once as the daemon allows
    (HoldStreamedShard); the client reads the shard through the daemon instead."""

    code, reason = status.TooManyHolds.code, status.TooManyHolds.reason


_BY_REASON[LeaseNotFoundError.reason] = LeaseNotFoundError
_BY_REASON[TooManyHoldsError.reason] = TooManyHoldsError


class DirectWriteUnavailableError(ShardcacheError):
    """direct=True, but this process cannot write the cache's files on the daemon's host
    (another host, a data dir mounted read-only or not at all); the message says which."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "DIRECT_WRITE_UNAVAILABLE"  # raised by the client itself, never sent by the daemon
