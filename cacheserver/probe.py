"""Waiting for a daemon the way a kubelet probe does: gRPC health checks."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class NotHealthy(TimeoutError):
    """The daemon did not answer SERVING in time."""


def wait_healthy(target: str, deadline_s: float = 30.0,
                 still_starting: Callable[[], bool] = lambda: True) -> None:
    """Block until the daemon at target answers SERVING to a health check.

    still_starting is polled between attempts; returning False (the process
    exited, say) stops the wait at once with NotHealthy.
    """
    deadline = time.monotonic() + deadline_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if not still_starting():
                raise NotHealthy(f"the daemon at {target} stopped while starting")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0,
                                   wait_for_ready=True)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise NotHealthy(f"the daemon at {target} was not healthy within {deadline_s:g}s")
            time.sleep(0.05)
