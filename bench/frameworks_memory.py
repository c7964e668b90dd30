"""Reproduces docs/benchmarks.md, "Client memory of the TF-free readers".

Client memory of the TF-free readers over many epochs: flat, or growing with the data?

    .venv/bin/python bench/frameworks_memory.py                  # 602 KB images, 10 epochs
    .venv/bin/python bench/frameworks_memory.py --epochs 20 --modes direct,plane

One cache of ``--elements`` ``{"x": float32 (224, 224, 3), "i": int64}`` elements written
with ``cc.write(block_bytes=0)``. Each reader runs in a process of its own, in the loader's
process (no workers), shuffled, in batches of ``--batch``: ``cc.numpy(batch_size=B)``,
Grain's ``DataLoader`` over ``cc.source()``, PyTorch's ``DataLoader`` over ``cc.source()``
(map-style) and over ``cc.torch(batch_size=B)`` (iterable); each reads directly (the shard
files) or over the data plane (``--modes``). The table gives the process's ``RssAnon``
(anonymous memory: the shard files' page cache does not count) after each epoch, in MB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import BenchDaemon, arguments, child_env
from probes import rss_anon_kib, run_line
from timing import markdown_table
from workloads import numpy_elements

READERS = ("numpy", "grain", "torch map", "torch iterable")


def epochs(reader: str, cc: Any, args: argparse.Namespace) -> Any:
    """One generator per epoch of reader over the cache (each item a batch)."""
    if reader == "numpy":
        arrays = cc.numpy("mem", shuffle=True, batch_size=args.batch, direct=args.direct)
        return lambda: arrays  # each iteration an epoch
    if reader == "grain":
        import grain.python as gp

        source = cc.source("mem", direct=args.direct)
        sampler = gp.IndexSampler(len(source), gp.NoSharding(), shuffle=True, num_epochs=1, seed=0)
        return lambda: gp.DataLoader(
            data_source=source, sampler=sampler, operations=[gp.Batch(args.batch)], worker_count=0
        )
    from torch.utils.data import DataLoader

    if reader == "torch map":
        source = cc.source("mem", direct=args.direct)
        return lambda: DataLoader(source, batch_size=args.batch, shuffle=True)
    dataset = cc.torch("mem", shuffle=True, batch_size=args.batch, direct=args.direct)
    return lambda: DataLoader(dataset, batch_size=None)


def child(args: argparse.Namespace) -> int:
    """In a child: the reader's RssAnon (KiB) after each epoch, one line."""
    from client import CacheClient

    with CacheClient(args.child) as cc:
        make = epochs(args.reader, cc, args)
        after = []
        for _ in range(args.epochs):
            for _ in make():
                pass
            after.append(rss_anon_kib())
    print(" ".join(map(str, after)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--modes", default="direct", help="direct, plane or both (comma)")
    for hidden in ("--child", "--reader"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    from client import CacheClient

    tmp = Path(tempfile.mkdtemp(prefix="fw-memory-"))
    daemon = BenchDaemon(tmp, "mem", tcp=True)
    daemon.start()
    rows = []
    try:
        with CacheClient(daemon.target) as cc:
            cc.write("mem", numpy_elements((224, 224, 3), args.elements), block_bytes=0)
        for mode in args.modes.split(","):
            target = daemon.target if mode == "direct" else str(daemon.tcp_target)
            for reader in READERS:
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        target,
                        "--reader",
                        reader,
                        "--epochs",
                        str(args.epochs),
                        "--batch",
                        str(args.batch),
                        *(["--direct"] if mode == "direct" else []),
                    ],
                    env=child_env(),
                    capture_output=True,
                    text=True,
                    check=True,
                )
                after = [int(kib) // 1024 for kib in done.stdout.split()[-args.epochs :]]
                rows.append((f"{reader}, {mode}", *map(str, after)))
    finally:
        daemon.stop()
    print(f"{run_line()}\n")
    print(markdown_table(("reader", *(f"after {e + 1}" for e in range(args.epochs))), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
