"""Server-side materialization: operations (:mod:`.operation`), what starts, watches
and resumes them (:mod:`.materializer`), the supervisor thread that runs each one
(:mod:`.supervisor`) and the worker processes that run a pipeline and write its
shards (:mod:`.worker`).
"""
