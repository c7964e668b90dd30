"""The PyTorch reads of tests/integration/test_torch_loaders.py, in a process without TensorFlow.

    python torch_reads.py TARGET NAME OUT

``import tensorflow`` fails here. Reads cache NAME (elements {"x": [i]*8, "i": i})
through PyTorch's DataLoader with two worker processes: cc.source() as a map-style
Dataset under a DistributedSampler in two gloo ranks (spawned workers), cc.torch()
as an IterableDataset (workers from a forkserver: in this process, then in each
of the two ranks; resumed mid-epoch from its state_dict(), in this process and
under torchdata's StatefulDataLoader with workers), and pickles the element ids
each read got to OUT.
"""

from __future__ import annotations

import itertools
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.modules["tensorflow"] = None  # type: ignore[assignment]  # import tensorflow fails
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from client import CacheClient  # noqa: E402

SPAWN = {"num_workers": 2, "multiprocessing_context": "spawn"}
#: Workers forked from a server process started clean, which imported this module (so torch)
#: once: each starts without importing torch again, unlike a spawned one.
FORKSERVER = {"num_workers": 2, "multiprocessing_context": "forkserver"}


def ids(batch: dict[str, Any]) -> list[int]:
    """A batch's ids, after checking each record is the element asked for, as a tensor."""
    x, i = batch["x"], batch["i"]
    assert isinstance(x, torch.Tensor) and isinstance(i, torch.Tensor), (type(x), type(i))
    assert x.dtype == torch.float32 and i.dtype == torch.int64
    assert bool((x == i.reshape(-1, 1).float()).all())
    return i.reshape(-1).tolist()


def epoch(loader: Any, batches: int | None = None) -> list[int]:
    """The ids of an epoch of loader's batches, or of its first batches."""
    return [i for batch in itertools.islice(loader, batches) for i in ids(batch)]


def rank_reads(rank: int, target: str, name: str, rendezvous: str, out: str) -> None:
    """One of two gloo ranks: a DistributedSampler over the source, then the iterable dataset
    sharded by rank and DataLoader worker; each loader with two workers (spawned for the
    sampler's, from a forkserver for the iterable's)."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    try:
        with CacheClient(target) as cc:
            source = cc.source(name)
            sampler = DistributedSampler(source, shuffle=True, seed=3)
            mapped = epoch(DataLoader(source, batch_size=16, sampler=sampler, **SPAWN))
            iterable = epoch(
                DataLoader(
                    cc.torch(name, shuffle=True, seed=4, batch_size=16),
                    batch_size=None,
                    **FORKSERVER,
                )
            )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(f"{out}.rank{rank}", "wb") as f:
        pickle.dump({"sampler": mapped, "iterable": iterable}, f)


def main(target: str, name: str, out: str) -> None:
    results: dict[str, Any] = {}
    with CacheClient(target) as cc:
        ds = cc.torch(name, shuffle=True, seed=7, batch_size=16)
        loader = DataLoader(ds, batch_size=None, pin_memory=True, **FORKSERVER)
        results["workers"] = [epoch(loader)]
        ds.set_epoch(1)
        results["workers"].append(epoch(loader))

        # in this process: elements, batched by the DataLoader, resumed from state_dict()
        ds = cc.torch(name, shuffle=True, seed=9)
        first = epoch(DataLoader(ds, batch_size=10), batches=25)
        state = ds.state_dict()
        again = cc.torch(name, shuffle=True, seed=9)
        again.load_state_dict(state)
        results["resume"] = first, state, epoch(DataLoader(again, batch_size=10))
        results["resume_next"] = epoch(DataLoader(again, batch_size=10))

        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(
            cc.torch(name, shuffle=True, seed=11, batch_size=8), batch_size=None, **FORKSERVER
        )
        first = epoch(loader, batches=20)
        saved = loader.state_dict()
        restored = StatefulDataLoader(
            cc.torch(name, shuffle=True, seed=11, batch_size=8), batch_size=None, **FORKSERVER
        )
        restored.load_state_dict(saved)
        results["stateful"] = first, epoch(restored)

    with tempfile.TemporaryDirectory() as tmp:
        # the ranks fork from this process's forkserver, which has imported torch
        torch.multiprocessing.start_processes(
            rank_reads,
            args=(target, name, f"{tmp}/rendezvous", out),
            nprocs=2,
            start_method="forkserver",
        )
    for rank in range(2):
        with open(f"{out}.rank{rank}", "rb") as f:
            results[f"rank{rank}"] = pickle.load(f)
    results["tensorflow"] = sys.modules.get("tensorflow", "missing")
    with open(out, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
