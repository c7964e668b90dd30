"""Records by global index: the Fetcher interface (:mod:`.fetch`), the one choice of
fetcher (:mod:`.factory`), same-host shard files (:mod:`.direct`), the data plane
(:mod:`.plane`), gRPC (:mod:`.rpc`), a fleet's owners (:mod:`.fleet`, :mod:`.fleet_calls`),
reconnect (:mod:`.reconnect`) and read leases (:mod:`.lease`)."""
