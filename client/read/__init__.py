"""The client's read path: epoch orders, worker shares and resume (:mod:`.order`,
:mod:`.plan`), parallel streams with reconnect (:mod:`.streams`), direct reads of
shard files on the daemon's host (:mod:`.direct`) and the byte-bounded queue
between them and TensorFlow (:mod:`.prefetch`). Internal: use :class:`client.CacheClient`.
"""
