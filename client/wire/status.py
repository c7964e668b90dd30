"""Every failure the daemon reports: its gRPC status code and machine-readable reason.

One exception class per failure a caller can act on, each carrying the code and
the reason it is sent with (AIP-193 style). The format layer and the daemon
raise them; the daemon's RPC edge (cacheserver/rpc) turns them into statuses.
The client's own exceptions (client/errors.py) take their codes and reasons
from these classes, so both sides name every reason from this one module.
"""

from __future__ import annotations

import grpc

#: Trailing-metadata key that carries the reason.
REASON_KEY = "shardcache-reason"


class CacheServerError(Exception):
    """Base of every error the daemon reports to a caller."""

    code = grpc.StatusCode.INTERNAL
    reason = "INTERNAL"


class InvalidArgument(CacheServerError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"


class CacheNotFound(CacheServerError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "CACHE_NOT_FOUND"


class CacheWriting(CacheServerError):
    """The cache exists but is still being written."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "CACHE_WRITING"


class FingerprintMismatch(CacheServerError):
    """The cache was produced by a different pipeline (or version)."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FINGERPRINT_MISMATCH"


class DiskFull(CacheServerError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "DISK_FULL"


class DataLoss(CacheServerError):
    code = grpc.StatusCode.DATA_LOSS
    reason = "DATA_CORRUPT"


class ShuttingDown(CacheServerError):
    code = grpc.StatusCode.UNAVAILABLE
    reason = "SHUTTING_DOWN"


class StoreUnavailable(CacheServerError):
    """The object store (serve --store) cannot be reached now; a retry may succeed."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "STORE_UNAVAILABLE"


class CapacityExceeded(CacheServerError):
    """A write needs more room than --max-bytes / --min-free-bytes allow, even after eviction."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "CAPACITY_EXCEEDED"


class TooManyStreams(CacheServerError):
    """The client host already holds --max-streams-per-client streams."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_STREAMS"


class MessageTooLarge(CacheServerError):
    """A request message larger than its method accepts (docs/protocol.md, "Limits")."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "MESSAGE_TOO_LARGE"


class Unauthenticated(CacheServerError):
    """The call carries no bearer token, or the wrong one."""

    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(CacheServerError):
    """The caller's credentials do not grant this verb on this cache (the daemon's
    --auth-file); the message names the principal, the verb and the cache."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class CacheExists(CacheServerError):
    """A READY cache already has that name (materialize needs overwrite)."""

    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "CACHE_EXISTS"


class OperationNotFound(CacheServerError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "OPERATION_NOT_FOUND"


class PipelineFailed(CacheServerError):
    """The user's pipeline raised while the daemon ran it; the message is its own."""

    code = grpc.StatusCode.UNKNOWN
    reason = "PIPELINE_FAILED"


class MaterializeNotAllowed(CacheServerError):
    """The operator has not allowed this entry point (--materialize-allow) or shipped
    pipelines (--allow-shipped-pipelines); the message names the setting."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "MATERIALIZE_NOT_ALLOWED"


class OperationCancelled(CacheServerError):
    code = grpc.StatusCode.CANCELLED
    reason = "OPERATION_CANCELLED"


class LeaseNotFound(CacheServerError):
    """A direct read lease expired (not renewed within its TTL) or was released."""

    code = grpc.StatusCode.NOT_FOUND
    reason = "LEASE_NOT_FOUND"


class TooManyHolds(CacheServerError):
    """A read lease holds as many streamed shards at once as the daemon allows one lease."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_HOLDS"
