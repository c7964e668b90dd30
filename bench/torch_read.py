"""Reproduces docs/benchmarks.md, "PyTorch over a cache and over a NumPy memmap".

PyTorch's DataLoader over a cache beside the same DataLoader over a NumPy memmap.

    .venv/bin/python bench/torch_read.py --shape 224,224,3 --elements 600
    .venv/bin/python bench/torch_read.py --shape 256 --elements 20000 --workers 0,2

The elements are ``{"x": float32 array of --shape, "i": int64}``: written twice with
``cc.write()``, with ``block_bytes=0`` (one stored value per element: for random access, the
map-style loader's and ``shuffle=True``'s) and with the default blocks (small elements packed
in ~256 KiB blocks: for ``shuffle="shards"``), and once into two ``.npy`` files read through
``np.load(..., mmap_mode="r")`` (in the page cache after the warm-up, as the cache's files
are). Two loaders
read each, shuffled, in batches of ``--batch``, with each ``--workers`` count (persistent
workers from a forkserver, started by the warm-up, so that epochs time reads, not starts):

* map-style: ``DataLoader(source, batch_size=B, shuffle=True)``; the cache's source is
  ``cc.source()``, the memmap's a Dataset whose ``__getitems__`` gathers the batch's rows
  with one fancy index (the cache's fetches its batch in one request);
* iterable: ``DataLoader(dataset, batch_size=None)``; the cache's is ``cc.torch(shuffle=True,
  batch_size=B)`` (``--shuffle shards``: ``shuffle="shards"``), the memmap's an IterableDataset
  yielding batches of B rows of one shuffled permutation per epoch, each worker its
  contiguous share (as the cache's shares are).

The cache is read directly (a client on the daemon's unix socket, the shard files under a
read lease) or over the data plane (``--modes``). Every arm is read once to warm up, then
``--repeat`` times in turn; the table gives best and median epochs and each cache arm's
ratio to the memmap arm of the same loader and worker count (best epochs).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import BenchDaemon, arguments, write_json
from probes import run_line
from timing import interleaved, markdown_table, ratio
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from workloads import numpy_elements

MODES = {"direct": ("unix", True), "plane": ("tcp", False)}


class MemmapSource(Dataset):  # type: ignore[type-arg]
    """Rows of two .npy memmaps by index; a batch gathered with one fancy index."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:  # opened in the process that reads
            self._arrays = (
                np.load(self.folder / "x.npy", mmap_mode="r"),
                np.load(self.folder / "i.npy", mmap_mode="r"),
            )
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_arrays": None}

    def __len__(self) -> int:
        return len(self.arrays()[1])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        x, i = self.arrays()
        keys = np.asarray(indices)
        xs, ids = x[keys], i[keys]
        return [{"x": xs[k], "i": ids[k]} for k in range(len(keys))]


class MemmapBatches(IterableDataset):  # type: ignore[type-arg]
    """Batches of a shuffled permutation of the memmaps' rows, each worker its share."""

    def __init__(self, folder: Path, batch: int, seed: int) -> None:
        self.source = MemmapSource(folder)
        self.batch, self.seed, self.epoch = batch, seed, 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        x, i = self.source.arrays()
        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(i))
        share = order[w * len(i) // workers : (w + 1) * len(i) // workers]
        for at in range(0, len(share), self.batch):
            keys = share[at : at + self.batch]
            yield {"x": torch.from_numpy(x[keys]), "i": torch.from_numpy(i[keys])}


def epoch(loader: DataLoader, n: int) -> Callable[[], float]:  # type: ignore[type-arg]
    def read() -> float:
        start = time.perf_counter()
        seen = 0
        for batch in loader:
            seen += len(batch["i"])
            batch["x"].reshape(-1)[:1].sum()  # touched, as a training step takes it
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
    parser.add_argument("--loaders", default="map,iterable")
    parser.add_argument(
        "--shuffle",
        default="elements",
        choices=["elements", "shards"],
        help="cc.torch()'s shuffle: every element (shuffle=True) or blocks of "
        "~1 MiB of stored order (shuffle='shards'); the memmap's is a "
        "permutation of rows either way",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads() in the loader's process (DataLoader "
        "workers use 1): more threads on a busy machine make default_collate's "
        "stack spin-wait, 0.68 s for a batch of 64 602 KB images at 2 against "
        "0.07 s at 1",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from client import CacheClient

    shape = tuple(int(d) for d in args.shape.split(","))
    workers = [int(w) for w in args.workers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="torch-read-"))
    daemon = BenchDaemon(tmp, "head", tcp=True)
    rates: dict[str, list[float]] = {}
    n, b = args.elements, args.batch
    try:
        daemon.start()
        x = np.lib.format.open_memmap(tmp / "x.npy", "w+", np.float32, (n, *shape))
        for e in numpy_elements(shape, n):
            x[e["i"]] = e["x"]
        x.flush()
        del x
        np.save(tmp / "i.npy", np.arange(n, dtype=np.int64))
        with CacheClient(daemon.target) as cc, CacheClient(str(daemon.tcp_target)) as remote:
            cc.write("torch", numpy_elements(shape, n), block_bytes=0)  # for random access
            cc.write("torch-blocks", numpy_elements(shape, n))  # as written by default
            clients = {"unix": cc, "tcp": remote}
            arms: dict[str, Callable[[], float]] = {}
            for w in workers:
                kw: dict[str, Any] = {"num_workers": w}
                if w:  # started once per loader: the epochs time the reads, not the starts
                    kw.update(multiprocessing_context="forkserver", persistent_workers=True)
                if "map" in args.loaders:
                    arms[f"map memmap, {w} workers"] = epoch(
                        DataLoader(MemmapSource(tmp), batch_size=b, shuffle=True, **kw), n
                    )
                    for mode in args.modes.split(","):
                        client, direct = MODES[mode]
                        source = clients[client].source("torch", direct=direct)
                        arms[f"map cache {mode}, {w} workers"] = epoch(
                            DataLoader(source, batch_size=b, shuffle=True, **kw), n
                        )
                if "iterable" in args.loaders:
                    arms[f"iterable memmap, {w} workers"] = epoch(
                        DataLoader(MemmapBatches(tmp, b, 1), batch_size=None, **kw), n
                    )
                    for mode in args.modes.split(","):
                        client, direct = MODES[mode]
                        ds = clients[client].torch(
                            "torch" if args.shuffle == "elements" else "torch-blocks",
                            shuffle=args.shuffle == "elements" or "shards",
                            seed=1,
                            batch_size=b,
                            direct=direct,
                        )
                        arms[f"iterable cache {mode}, {w} workers"] = epoch(
                            DataLoader(ds, batch_size=None, **kw), n
                        )
            rates = interleaved(arms, args.repeat)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {name: max(r) for name, r in rates.items()}

    def base(name: str) -> float:
        loader, rest = name.split(" ", 1)
        return best[f"{loader} memmap, {rest.rsplit(', ', 1)[1]}"]

    print(run_line())
    print(
        markdown_table(
            ["loader", "best elements/s", "median", "vs memmap (same loader, workers)"],
            (
                [
                    name,
                    f"{rate:,.0f}",
                    f"{statistics.median(rates[name]):,.0f}",
                    ratio(rate, base(name)),
                ]
                for name, rate in best.items()
            ),
        )
    )
    write_json(args.out, {"command": run_line(), "rates": rates})
    return 0


if __name__ == "__main__":
    sys.exit(main())
