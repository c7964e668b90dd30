"""The client's read path: epoch orders, worker shares and resume (:mod:`.order`,
:mod:`.plan`), an epoch's share as chunks read in tf.data's threads (:mod:`.chunks`),
fetched over gRPC with reconnect (:mod:`.fetch`), from a fleet's owners
(:mod:`.fleet_fetch`, :mod:`.fleet_calls`) or from the shard files on the daemon's
host (:mod:`.direct`), and decoded (:mod:`.decode`). Internal: use :class:`client.CacheClient`.
"""
