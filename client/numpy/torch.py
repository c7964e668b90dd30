"""CacheIterable: a READY cache as a PyTorch IterableDataset (cc.torch()); imports torch.

Each iteration reads one epoch with cc.numpy()'s reader (client/numpy/reader.py)
in the process that iterates, as the share of worker
``rank * workers + worker_id`` of ``world_size * workers``: ``workers`` and
``worker_id`` from ``torch.utils.data.get_worker_info()`` (1 and 0 outside a
DataLoader worker), ``rank`` and ``world_size`` given, or else torch.distributed's
when its process group is initialized (read in the process that starts the
DataLoader's workers, whose pickled copy carries them), else 0 and 1. The shares
of one epoch are disjoint and cover it, as cc.numpy()'s are.

Elements (or the reader's batches, with batch_size) come as tensors:
NumPy arrays and scalars become tensors sharing their memory, as PyTorch's
``default_convert`` makes them (:func:`tensors`: dicts of numeric arrays without
its generic walk); strings stay bytes (object arrays of bytes). ``state_dict()`` is the
ReadState of this process's latest iteration (JSON), ``load_state_dict()`` makes
the next iteration resume there; torchdata's StatefulDataLoader calls both in
each worker process, so a loader with workers resumes mid-epoch too. Like
cc.source(), the dataset pickles without a connection and each process
connects on its first iteration: spawn the workers (docs/frameworks.md).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, default_convert, get_worker_info

from client._daemons import Daemons
from client.errors import InvalidArgumentError
from client.numpy.reader import ArrayReader
from client.numpy.source import Opener
from client.read.planning import plan

#: NumPy dtype kinds torch.from_numpy takes: bool, signed, unsigned, float, complex.
_NUMERIC = frozenset("biufc")


def tensors(item: Any) -> Any:
    """item with its NumPy arrays as tensors sharing their memory, as default_convert gives
    it: a dict's values and numeric arrays here (torch.from_numpy), anything else by
    default_convert, whose checks against collections.abc's classes took four times as
    long on a batch of two arrays."""
    kind = type(item)
    if kind is np.ndarray and item.dtype.kind in _NUMERIC:
        return torch.from_numpy(item)
    if kind is dict:
        return {key: tensors(value) for key, value in item.items()}
    return default_convert(item)


def _distributed() -> tuple[int, int] | None:
    """(rank, world size) of torch.distributed's process group, when one is initialized."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class CacheIterable(IterableDataset):  # type: ignore[type-arg]
    """A READY cache's epochs as tensors, each DataLoader worker of each rank its share."""

    def __init__(
        self,
        name: str,
        opener: Opener,
        options: plan.ReadOptions,
        placement: tuple[int, int] | None,
    ) -> None:
        self.name = name
        self._opener = opener
        # worker_index/num_workers: set per iteration; a random seed when shuffling without
        # one, which the DataLoader workers of one rank share, but other ranks do not
        self._random_seed = bool(options.shuffle) and options.seed is None
        self._options = options.with_seed()
        self._placement = placement  # (rank, world size) given to cc.torch()
        self._epoch = options.epoch  # the epoch the next iteration reads
        self._resume: plan.Resume = None  # loaded: where the next iteration starts
        self._distributed: tuple[int, int] | None = None  # torch.distributed's, when pickled
        self._reader: ArrayReader | None = None
        self._opened: tuple[int, Daemons, Path | None] | None = None
        self._sent = False  # pickled (to DataLoader workers) since this process last read

    def __getstate__(self) -> dict[str, Any]:
        self._sent = True
        return {
            "name": self.name,
            "opener": self._opener,
            "options": self._options,
            "placement": self._placement,
            "epoch": self._epoch,
            "resume": self._resume,
            "random_seed": self._random_seed,
            "distributed": _distributed() or self._distributed,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["opener"], state["options"], state["placement"])  # type: ignore[misc]
        self._epoch, self._resume = state["epoch"], state["resume"]
        self._random_seed = state["random_seed"]
        self._distributed = state["distributed"]

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads epoch (from its start), as DistributedSampler.set_epoch.

        Call it before each epoch when the DataLoader's workers are not persistent:
        each epoch's workers get a fresh copy of this dataset. A state loaded with
        load_state_dict() still applies to the next iteration, unless epoch is past
        the state's (its copies in the workers of an earlier epoch resumed it)."""
        plan.ReadOptions(epoch=epoch)  # checks it
        resume = self._resume
        if resume is not None and epoch > (
            resume.epoch if isinstance(resume, plan.ReadState) else min(s.epoch for s in resume)
        ):
            self._resume = None
        self._epoch = epoch

    def _shard(self) -> tuple[int, int]:
        """(worker_index, num_workers) of this process's share: from the DataLoader worker
        and the rank and world size."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank_world()
        return rank * workers + worker, world * workers

    def _rank_world(self) -> tuple[int, int]:
        return self._placement or _distributed() or self._distributed or (0, 1)

    def __iter__(self) -> Iterator[Any]:
        worker_index, num_workers = self._shard()
        if self._random_seed and self._rank_world()[1] > 1:
            raise InvalidArgumentError(
                "shuffling across ranks needs seed=: every rank must compute the same order, "
                "or their shares overlap; pass cc.torch(..., seed=S)"
            )
        options = dataclasses.replace(
            self._options,
            worker_index=worker_index,
            num_workers=num_workers,
            resume=self._resume,
            epoch=self._epoch if self._resume is None else 0,
        )
        daemons, local_data_dir = self._daemons()
        self._resume = None
        reader = ArrayReader(daemons, local_data_dir, self.name, options)
        self._reader, self._sent = reader, False
        self._epoch = reader.options.epoch + 1
        for item in reader:
            yield tensors(item)

    def _daemons(self) -> tuple[Daemons, Path | None]:
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = None  # a forked copy: the parent's channels stay its own
            daemons, local_data_dir = self._opener()
            self._opened = (os.getpid(), daemons, local_data_dir)
        return self._opened[1], self._opened[2]

    def state_dict(self) -> dict[str, Any]:
        """Where this process's reading stands: {"read_state": the ReadState JSON after the
        elements the latest iteration handed out} ({"epoch": e} before any). Resume with
        load_state_dict(); the ReadState also resumes cc.numpy() and cc.dataset()."""
        if self._resume is not None:
            if isinstance(self._resume, plan.ReadState):
                return {"read_state": self._resume.to_json()}
            return {"read_states": [s.to_json() for s in self._resume]}
        if self._reader is None or self._opened is None or self._opened[0] != os.getpid():
            if self._sent:
                raise InvalidArgumentError(
                    f"cache {self.name!r}: this dataset was read in DataLoader worker "
                    "processes, whose positions this process cannot see; save the state of "
                    "torchdata's StatefulDataLoader (loader.state_dict(), which holds each "
                    "worker's state_dict()), or read with num_workers=0"
                )
            return {"epoch": self._epoch}
        return {"read_state": self._reader.state().to_json()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next iteration where state_dict() was taken: {"read_state": JSON} (this
        shard's), {"read_states": [JSON, ...]} (every shard of a split, for an elastic
        resume with any number of workers and ranks), or {"epoch": e}."""
        if (
            not isinstance(state, Mapping)
            or len(state) != 1
            or next(iter(state)) not in ("read_state", "read_states", "epoch")
        ):
            raise InvalidArgumentError(
                f"not a state_dict() of cc.torch()'s dataset: {state!r:.120}; pass what "
                "state_dict() returned"
            )
        if "epoch" in state:
            self.set_epoch(state["epoch"])
            self._resume = None
        elif "read_state" in state:
            self._resume = plan.ReadState.from_json(state["read_state"])
        else:
            self._resume = [plan.ReadState.from_json(s) for s in state["read_states"]]

    def close(self) -> None:
        """Close this process's connection; the next iteration opens another."""
        opened, self._opened, self._reader = self._opened, None, None
        if opened is not None and opened[0] == os.getpid():
            opened[1].close()

    def __repr__(self) -> str:
        return (
            f"CacheIterable({self.name!r}, epoch={self._epoch}, "
            f"batch_size={self._options.batch_size})"
        )
