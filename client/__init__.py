"""shardcache client: stream cached dataset elements from a cacheserver into tf.data.

    from client import CacheClient
    cc = CacheClient("unix:///run/cacheserver/cacheserver.sock")
    ds = cc.cache(ds, name="imagenet-train")     # instead of ds.cache()

Importing this package does not import TensorFlow; it loads on first use.
cc.numpy(), cc.write() and cc.source() read and write caches as NumPy arrays
without it (docs/frameworks.md).
"""

from client._client import CacheClient
from client._daemons import CacheInfo
from client._materialize import MaterializeOperation, Progress
from client.errors import (
    CacheExistsError,
    CacheNotFoundError,
    CacheNotReadyError,
    CapacityExceededError,
    DataLossError,
    DirectReadUnavailableError,
    DirectWriteUnavailableError,
    DiskFullError,
    FingerprintMismatchError,
    InternalError,
    InvalidArgumentError,
    MaterializeNotAllowedError,
    MessageTooLargeError,
    OperationCancelledError,
    OperationNotFoundError,
    PermissionDeniedError,
    PipelineError,
    ReconnectTimeoutError,
    ResumeMismatchError,
    ServerUnavailableError,
    ShardcacheError,
    StoreUnavailableError,
    TooManyStreamsError,
    UnauthenticatedError,
)
from client.observe.report import InputStall
from client.read.planning.plan import ReadState

__all__ = [
    "CacheClient",
    "CacheExistsError",
    "CacheInfo",
    "CacheNotFoundError",
    "CacheNotReadyError",
    "CapacityExceededError",
    "DataLossError",
    "DirectReadUnavailableError",
    "DirectWriteUnavailableError",
    "DiskFullError",
    "FingerprintMismatchError",
    "InputStall",
    "InputStallCallback",
    "InternalError",
    "InvalidArgumentError",
    "MaterializeNotAllowedError",
    "MaterializeOperation",
    "MessageTooLargeError",
    "OperationCancelledError",
    "OperationNotFoundError",
    "PermissionDeniedError",
    "PipelineError",
    "Progress",
    "ReadState",
    "ReconnectTimeoutError",
    "ResumeMismatchError",
    "ServerUnavailableError",
    "ShardcacheError",
    "StoreUnavailableError",
    "TooManyStreamsError",
    "UnauthenticatedError",
]


def __getattr__(name: str) -> object:
    """InputStallCallback, a Keras callback: imports TensorFlow, so only when asked for."""
    if name == "InputStallCallback":
        from client.tf.stall import InputStallCallback

        return InputStallCallback
    raise AttributeError(f"module 'client' has no attribute {name!r}")
