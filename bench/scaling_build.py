"""Building and sizing the caches of ``bench/scaling.py``.

``scaling_build:flat_shard`` is the materialization entry point (the daemon runs with
``--pythonpath bench --materialize-allow scaling_build:flat_shard``): shard ``i`` of ``S``
holds elements ``[n*i/S, n*(i+1)/S)`` of the flat workload named in the JSON file
``$SC_SCALING_PLAN``, so the global order is the index order and every label checksum holds.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from measure import drop_page_cache
from workloads import WORKLOADS, flat_source

PLAN_ENV = "SC_SCALING_PLAN"  # JSON file naming the workload and size the workers build


def flat_shard(shard_index: int, num_shards: int) -> Any:
    """Materialization entry point: one contiguous run of the plan's elements."""
    plan = json.loads(Path(os.environ[PLAN_ENV]).read_text())
    n = plan["n"]
    return flat_source(WORKLOADS[plan["workload"]], n * shard_index // num_shards,
                       n * (shard_index + 1) // num_shards)


def materialize(target: str, plan_file: Path, name: str, workload: str, n: int, workers: int,
                shard_bytes: int) -> dict[str, Any]:
    """Have the daemon materialize ``n`` elements of ``workload`` as ``name``; describe it.

    Shards hold about ``shard_bytes`` of payload (at least two per worker). Besides the wall
    time, the steady rate is the payload stored from the first progress report that shows
    stored bytes to the end, over that time: what the workers do once TensorFlow is loaded.
    """
    from client import CacheClient, MaterializeOperation

    plan_file.write_text(json.dumps({"workload": workload, "n": n}))
    payload = n * WORKLOADS[workload].element_bytes
    shards = max(2 * workers, -(-payload // shard_bytes))
    start = time.perf_counter()
    first: tuple[float, int] | None = None  # when the first elements were stored
    with CacheClient(target) as cc:
        op = cc.materialize("scaling_build:flat_shard", name=name, num_shards=shards,
                            workers=workers, wait=False)
        assert isinstance(op, MaterializeOperation)  # wait=False returns the operation
        while not (progress := op.progress()).done:
            if first is None and progress.raw_bytes:
                first = (time.perf_counter(), progress.raw_bytes)
            time.sleep(0.25)  # a sampling period for the steady rate, not synchronisation
        progress = op.wait()
        seconds = time.perf_counter() - start
        info = cc.info(name)
    if info.num_elements != n:
        raise RuntimeError(f"materialized {info.num_elements} elements, expected {n}")
    steady = None
    if first is not None and start + seconds - first[0] > 0.5:
        steady = (progress.raw_bytes - first[1]) / (start + seconds - first[0])
    return {"name": name, "n": n, "method": f"materialize, {workers} workers",
            "seconds": seconds, "payload_bytes": payload, "steady_bytes_per_s": steady,
            "stored_bytes": progress.stored_bytes, "shards": shards}


def project_build_seconds(builds: list[dict[str, Any]], payload: float) -> dict[str, float]:
    """Projected seconds to build ``payload`` bytes, per build method measured in ``builds``.

    Write-through's time is proportional (its epoch 1 starts in a running process);
    materialization pays a fixed start (workers importing TensorFlow), taken as its wall
    time less the share of its steady rate.
    """
    projected = {}
    for build in builds:
        rate = build["payload_bytes"] / build["seconds"]
        if build["method"] == "write-through":
            projected["write-through"] = payload / rate
        else:
            steady = build.get("steady_bytes_per_s") or rate
            fixed = max(0.0, build["seconds"] - build["payload_bytes"] / steady)
            projected["materialize"] = fixed + payload / steady
    return projected


def project_rss(points: list[tuple[int, float]], payload: int) -> float | None:
    """Peak RssAnon (MB) at ``payload`` bytes, extrapolated from measured (bytes, MB) points.

    Linear through the last two points; from one point, proportional (the pessimistic guess).
    """
    if not points:
        return None
    if len(points) == 1:
        (x, y), = points
        return y * payload / x
    (x0, y0), (x1, y1) = points[-2:]
    slope = (y1 - y0) / (x1 - x0) if x1 != x0 else y1 / x1
    return y1 + slope * (payload - x1)


def cold_sequential_read(files: list[Path]) -> tuple[int, float]:
    """Drop the page cache, then read ``files`` front to back, 1 MiB per read(): bytes, s."""
    drop_page_cache()
    moved = 0
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while block := handle.read(1 << 20):
                moved += len(block)
    return moved, time.perf_counter() - start
