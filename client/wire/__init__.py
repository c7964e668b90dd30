"""The wire: the generated gRPC code (:mod:`.v1`), chunk framing without
protobuf's copies (:mod:`.chunks`) and every error reason with its status code
(:mod:`.status`). Shared by the client and the daemon; imports neither.
"""
