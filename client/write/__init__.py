"""The client's write path: the WriteCache stream holding the lease
(:mod:`.stream`), the write-behind thread that packs and sends batches
(:mod:`.write_behind`) and direct writes of shard files on the daemon's host
(:mod:`.direct`). Internal: use :class:`client.CacheClient`.
"""
