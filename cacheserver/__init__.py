"""shardcache daemon: materializes dataset shards into zstd-compressed LMDB stores.

Importing this package is cheap: it pulls in neither lmdb nor TensorFlow; the
generated wire code lives in :mod:`cacheserver.v1`.
"""

__version__ = "0.1.0"
