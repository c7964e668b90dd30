"""The ``cacheserver`` command line (:mod:`.main`) and its ``materialize`` command."""

#: --target of every command that talks to a daemon.
TARGET_HELP = (
    "daemon address: HOST:PORT or unix:///path.sock "
    "[default: $SHARDCACHE_TARGET, else 127.0.0.1:50051]; credentials from $CACHESERVER_TOKEN "
    "and, for TLS, $SHARDCACHE_TLS_CA (mutual: $SHARDCACHE_TLS_CERT, $SHARDCACHE_TLS_KEY)"
)
