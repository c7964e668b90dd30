"""Server-side materialization: operations (:mod:`.operation`), the supervisor that
runs them (:mod:`.materializer`) and the worker processes that run a pipeline and
write its shards (:mod:`.worker`).
"""
