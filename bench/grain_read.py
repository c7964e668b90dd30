"""Reproduces docs/benchmarks.md, "Grain over a cache and over ArrayRecord".

Grain's DataLoader over cc.source() beside Grain over ArrayRecord of the same elements.

    .venv/bin/python bench/grain_read.py --shape 224,224,3 --elements 600
    .venv/bin/python bench/grain_read.py --shape 256 --elements 20000 --workers 0,2

The elements are ``{"x": float32 array of --shape, "i": int64}``: written once with
``cc.write(block_bytes=0)`` (one element per stored value, for random access) and once into
an ArrayRecord file (``group_size:1``, each record the element's bytes, parsed back with
``np.frombuffer`` in a map). Both are read by Grain's DataLoader, shuffled by one
IndexSampler seed, in batches of ``--batch``, with each ``--workers`` count; the source reads
the cache directly (a client on the daemon's unix socket, the shard files under a read lease)
or over the data plane (``--modes``). Every arm is read once to warm up, then ``--repeat``
times in turn; the table gives best and median epochs and each arm's ratio to ArrayRecord
with the same worker count (best epochs).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grain.python as gp
import numpy as np
from harness import BenchDaemon, arguments, write_json
from probes import run_line
from timing import interleaved, markdown_table, ratio
from workloads import numpy_elements

MODES = {"direct": ("unix", True), "plane": ("tcp", False)}


class Parse(gp.MapTransform):
    """An ArrayRecord record back into its element (a Grain MapTransform, picklable)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def map(self, record: bytes) -> dict[str, np.ndarray]:
        return {
            "x": np.frombuffer(record, np.float32, offset=8).reshape(self.shape),
            "i": np.frombuffer(record, np.int64, count=1)[0],
        }


def epoch(
    source: Any, operations: list[Any], n: int, workers: int, batch: int, seed: int, buffer: int = 0
) -> Callable[[], float]:
    """buffer: Grain's ReadOptions.prefetch_buffer_size (0: Grain's default)."""

    def read() -> float:
        sampler = gp.IndexSampler(
            num_records=n, shard_options=gp.NoSharding(), shuffle=True, num_epochs=1, seed=seed
        )
        options = {"read_options": gp.ReadOptions(prefetch_buffer_size=buffer)} if buffer else {}
        loader = gp.DataLoader(
            data_source=source,
            sampler=sampler,
            operations=[*operations, gp.Batch(batch)],
            worker_count=workers,
            **options,
        )
        start = time.perf_counter()
        seen = sum(len(b["i"]) for b in loader)
        seconds = time.perf_counter() - start
        if seen != n:
            raise RuntimeError(f"an epoch yielded {seen} elements, not {n}")
        return n / seconds

    return read


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, out=True, repeat=3)
    parser.add_argument("--shape", default="224,224,3")
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument("--modes", default="direct,plane")
    parser.add_argument(
        "--prefetch-buffer",
        type=int,
        default=0,
        help="Grain's ReadOptions(prefetch_buffer_size=) for both sources "
        "(0: Grain's default, 500): its loader walks the elements ready in "
        "that buffer once per element it hands out",
    )
    args = parser.parse_args(argv)
    from array_record.python.array_record_module import ArrayRecordWriter

    from client import CacheClient

    shape = tuple(int(d) for d in args.shape.split(","))
    workers = [int(w) for w in args.workers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="grain-read-"))
    daemon = BenchDaemon(tmp, "head", tcp=True)
    rates: dict[str, list[float]] = {}
    try:
        daemon.start()
        path = str(tmp / "elements.array_record")
        writer = ArrayRecordWriter(path, "group_size:1")
        for e in numpy_elements(shape, args.elements):
            writer.write(e["i"].tobytes() + e["x"].tobytes())
        writer.close()
        with CacheClient(daemon.target) as cc, CacheClient(str(daemon.tcp_target)) as remote:
            cc.write("grain", numpy_elements(shape, args.elements), block_bytes=0)
            clients = {"unix": cc, "tcp": remote}
            arms: dict[str, Callable[[], float]] = {}
            for w in workers:
                arms[f"ArrayRecord, {w} workers"] = epoch(
                    gp.ArrayRecordDataSource([path]),
                    [Parse(shape)],
                    args.elements,
                    w,
                    args.batch,
                    1,
                    args.prefetch_buffer,
                )
                for mode in args.modes.split(","):
                    client, direct = MODES[mode]
                    arms[f"cache {mode}, {w} workers"] = epoch(
                        clients[client].source("grain", direct=direct),
                        [],
                        args.elements,
                        w,
                        args.batch,
                        1,
                        args.prefetch_buffer,
                    )
            rates = interleaved(arms, args.repeat)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {name: max(r) for name, r in rates.items()}
    print(run_line())
    print(
        markdown_table(
            ["reader", "best elements/s", "median", "vs ArrayRecord (same workers)"],
            (
                [
                    name,
                    f"{rate:,.0f}",
                    f"{statistics.median(rates[name]):,.0f}",
                    ratio(rate, best[f"ArrayRecord, {name.rsplit(', ', 1)[1]}"]),
                ]
                for name, rate in best.items()
            ),
        )
    )
    write_json(args.out, {"command": run_line(), "rates": rates})
    return 0


if __name__ == "__main__":
    sys.exit(main())
