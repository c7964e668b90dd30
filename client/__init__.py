"""shardcache client: stream cached dataset elements from a cacheserver into tf.data.

    from client import CacheClient
    cc = CacheClient("unix:///run/cacheserver/cacheserver.sock")
    ds = cc.cache(ds, name="imagenet-train")     # instead of ds.cache()

Importing this package does not import TensorFlow; it loads on first use.
"""

from client._client import CacheClient, CacheInfo
from client._plan import ReadState
from client.errors import (
    CacheNotFoundError,
    CacheNotReadyError,
    DataLossError,
    DiskFullError,
    FingerprintMismatchError,
    InternalError,
    InvalidArgumentError,
    ReconnectTimeoutError,
    ResumeMismatchError,
    ServerUnavailableError,
    ShardcacheError,
)

__all__ = [
    "CacheClient",
    "CacheInfo",
    "CacheNotFoundError",
    "CacheNotReadyError",
    "DataLossError",
    "DiskFullError",
    "FingerprintMismatchError",
    "InternalError",
    "InvalidArgumentError",
    "ReadState",
    "ReconnectTimeoutError",
    "ResumeMismatchError",
    "ServerUnavailableError",
    "ShardcacheError",
]
