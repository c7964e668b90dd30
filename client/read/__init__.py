"""The client's read path, in three stages, behind one opening (:mod:`.opening`).

- :mod:`.planning`: what one worker reads each epoch: orders, shares, options,
  resume states, mixes of caches (pure: no I/O).
- :mod:`.fetching`: records by index: one Fetcher interface, picked in one place
  (same-host shard files, the data plane, gRPC, a fleet's owners), with leases and
  reconnect.
- :mod:`.assembly`: an epoch's share as numbered chunks, decoded into arrays.

Internal: use :class:`client.CacheClient`.
"""
