"""Where a cache's state lives: which caches exist and their states
(:mod:`.catalog`), their manifests on disk (:mod:`.manifest`), writes in progress
(:mod:`.writes`, :mod:`.write_session`, :mod:`.direct_writes`), reads
(:mod:`.reads`), room and eviction (:mod:`.capacity`), pins and TTLs
(:mod:`.retention`), start-up recovery (:mod:`.recovery`), direct read leases
(:mod:`.leases`) and the object-store tier (:mod:`.remote`, :mod:`.pulls`,
:mod:`.stored`). Knows nothing of gRPC.
"""
