"""The training container of tests/image: runs inside the image (no TensorFlow), in the
daemon's pod, with the sidecar's environment (SHARDCACHE_TARGET, the socket;
SHARDCACHE_LOCAL_DATA_DIR, the daemon's data dir mounted read-only).

    python3 trainer.py write NAME COUNT    # write a cache over the socket, read it back directly
    python3 trainer.py read NAME COUNT     # read it back directly, check every element

First it waits, as a startupProbe lets the kubelet wait, for the daemon's gRPC health to
be SERVING on the socket and on TCP port 50051 (the pod's shared network). Prints one JSON
object: what it saw; exits non-zero where an element differs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import CacheClient

SERVICE = "cacheserver.v1.CacheService"


def health(target: str, deadline_s: float = 60.0) -> str:
    """The health status of target once SERVING, or the last one seen at the deadline."""
    request = health_pb2.HealthCheckRequest(service=SERVICE)
    deadline = time.monotonic() + deadline_s
    status = "UNREACHABLE"
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(
                    stub.Check(request, timeout=2).status
                )
            except grpc.RpcError as e:
                status = f"UNREACHABLE: {e.code().name}"
            if status == "SERVING" or time.monotonic() > deadline:
                return status
            time.sleep(0.1)  # a probe's period


def element(i: int) -> dict[str, Any]:
    return {"image": np.full((32, 32, 3), i % 251, np.uint8), "label": np.int64(i)}


def elements(count: int) -> Iterator[dict[str, Any]]:
    return (element(i) for i in range(count))


def read_back(cc: CacheClient, name: str, count: int) -> int:
    """Every element of cache name, read directly from the mounted files; the number
    that differ from what was written."""
    wrong = 0
    seen = 0
    for i, got in enumerate(cc.numpy(name, direct=True)):
        want = element(i)
        seen += 1
        if not (np.array_equal(got["image"], want["image"]) and got["label"] == want["label"]):
            wrong += 1
    return wrong + abs(count - seen)


def main() -> int:
    command, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    socket_target = os.environ["SHARDCACHE_TARGET"]
    seen: dict[str, Any] = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "health_socket": health(socket_target),
        "health_tcp": health("127.0.0.1:50051"),
    }
    with CacheClient() as cc:
        if command == "write":
            cc.write(name, elements(count))
        before = cc.info(name).direct_reads
        seen["wrong"] = read_back(cc, name, count)
        info = cc.info(name)
        seen |= {
            "state": info.state,
            "num_elements": info.num_elements,
            "direct_passes": info.direct_reads - before,
            "caches": sorted(c.name for c in cc.list()),
        }
    print(json.dumps(seen))
    return 1 if seen["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
