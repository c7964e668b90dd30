"""Where requests are received: the gRPC server and its listeners (:mod:`.server`),
the servicer (:mod:`.service`, which translates and delegates), the zero-copy
chunk handlers (:mod:`.streams`), operations as messages (:mod:`.operations`)
and the interceptors every call passes through (:mod:`.interceptors`).
"""
