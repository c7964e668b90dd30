"""shardcache daemon: materializes dataset shards into zstd-compressed LMDB stores.

Importing this package is cheap: it pulls in neither lmdb nor TensorFlow. The
daemon builds on the client's format layer (:mod:`client.format`,
:mod:`client.wire`) and never on the client's internals:

- :mod:`cacheserver.rpc`: where requests are received (the gRPC server, the
  servicer that translates, interceptors for auth, limits, logs and metrics);
- :mod:`cacheserver.catalog`: where a cache's state lives (caches, writes,
  shards on disk, capacity, retention, direct read leases);
- :mod:`cacheserver.materialize`: the daemon running pipelines in workers;
- :mod:`cacheserver.cli` and :mod:`cacheserver.demo`: the command line;
- :mod:`cacheserver.config`, :mod:`cacheserver.security`,
  :mod:`cacheserver.metrics`, :mod:`cacheserver.launch`: settings, TLS and
  tokens, Prometheus metrics, and a daemon as a child process.
"""

__version__ = "0.1.0"
