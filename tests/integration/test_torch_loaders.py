"""PyTorch's DataLoader over a cache, in a process where ``import tensorflow`` fails.

One process without TensorFlow (tests/pipelines/torch_reads.py) reads a cache
that cc.write() built through DataLoaders with spawned worker processes:
cc.source() as a map-style Dataset (and under a DistributedSampler in two gloo
ranks), cc.torch() as an IterableDataset sharded by DataLoader worker and rank,
and resumed mid-epoch from its state_dict(). The tests check each read's
element multiset against the cache's.
"""

from __future__ import annotations

import collections
import itertools
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from daemon import Daemon, env_without_tf_noise

from client import CacheClient, InvalidArgumentError, ReadState

N = 400
PROGRAM = Path(__file__).parents[1] / "pipelines" / "torch_reads.py"
ALL = list(range(N))


@pytest.fixture(scope="module")
def run(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the TF-free process read."""
    with CacheClient(daemon.unix_target) as cc:
        cc.write(
            "torch-loaders",
            ({"x": np.full(8, i, np.float32), "i": np.int64(i)} for i in range(N)),
            version="1",
            block_bytes=1024,
        )
    out = tmp_path_factory.mktemp("torch") / "results.pickle"
    done = subprocess.run(
        [sys.executable, str(PROGRAM), daemon.unix_target, "torch-loaders", str(out)],
        env=env_without_tf_noise(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    with open(out, "rb") as f:
        return pickle.load(f)


def test_the_reading_process_never_imported_tensorflow(run) -> None:
    assert run["tensorflow"] is None


def test_a_distributed_sampler_over_two_gloo_ranks_splits_the_source_exactly(run) -> None:
    ranks = [run["rank0"]["sampler"], run["rank1"]["sampler"]]
    assert [len(r) for r in ranks] == [N // 2, N // 2]
    assert sorted(ranks[0] + ranks[1]) == ALL
    assert ranks[0] != sorted(ranks[0])  # shuffled


def test_an_iterable_dataset_shares_each_epoch_among_workers_and_ranks(run) -> None:
    first, second = run["workers"]
    assert sorted(first) == ALL and sorted(second) == ALL
    assert first != second  # set_epoch(1): the next epoch's order
    ranks = [run["rank0"]["iterable"], run["rank1"]["iterable"]]
    assert [len(r) for r in ranks] == [N // 2, N // 2]
    assert sorted(ranks[0] + ranks[1]) == ALL


def test_an_iterable_dataset_resumes_mid_epoch_from_its_state_dict(run) -> None:
    first, state, rest = run["resume"]
    assert len(first) == 250
    assert sorted(first + rest) == ALL
    read_state = ReadState.from_json(state["read_state"])
    assert (read_state.epoch, read_state.start) == (0, 250)
    assert sorted(run["resume_next"]) == ALL  # then whole epochs
    assert run["resume_next"] != first + rest


def test_a_stateful_dataloader_with_two_workers_resumes_mid_epoch(run) -> None:
    first, rest = run["stateful"]
    assert len(first) == 20 * 8
    assert collections.Counter(first + rest) == collections.Counter(ALL)


def test_a_state_dict_of_a_dataset_read_by_worker_processes_is_refused(cc, name) -> None:
    cc.write(name, ({"i": np.int64(i)} for i in range(10)))
    ds = cc.torch(name)
    assert ds.state_dict() == {"epoch": 0}
    pickle.dumps(ds)  # what a DataLoader does to send it to its workers
    with pytest.raises(InvalidArgumentError, match="StatefulDataLoader"):
        ds.state_dict()
    assert [int(e["i"]) for e in ds] == list(range(10))  # read here: its own state again
    assert ReadState.from_json(ds.state_dict()["read_state"]).epoch == 1


def test_shuffling_across_ranks_without_a_seed_is_refused(cc, name) -> None:
    cc.write(name, ({"i": np.int64(i)} for i in range(10)))
    with pytest.raises(InvalidArgumentError, match="seed="):
        cc.torch(name, shuffle=True, rank=0, world_size=2)
    with pytest.raises(InvalidArgumentError, match="together"):
        cc.torch(name, rank=0)
    with pytest.raises(InvalidArgumentError, match="state_dict"):
        cc.torch(name).load_state_dict({"position": 3})


def test_the_states_of_two_ranks_resume_in_one_elastically(cc, name) -> None:
    cc.write(name, ({"i": np.int64(i)} for i in range(100)))
    ranks = [cc.torch(name, shuffle=True, seed=5, rank=r, world_size=2) for r in range(2)]
    firsts = [[int(e["i"]) for e in itertools.islice(ds, n)] for ds, n in zip(ranks, (10, 30))]
    states = [ds.state_dict()["read_state"] for ds in ranks]
    one = cc.torch(name, shuffle=True, seed=5)
    one.load_state_dict({"read_states": states})
    assert one.state_dict() == {"read_states": states}
    rest = [int(e["i"]) for e in one]
    assert sorted(firsts[0] + firsts[1] + rest) == list(range(100))
    assert ReadState.from_json(one.state_dict()["read_state"]).epoch == 1


def test_a_loaded_state_holds_for_its_epoch_and_yields_to_a_later_one(cc, name) -> None:
    """A plain DataLoader's workers resume copies of the loaded dataset, which never reads
    in the loader's process: set_epoch() past the state's epoch must drop it there."""
    cc.write(name, ({"i": np.int64(i)} for i in range(10)))
    ds = cc.torch(name, shuffle=True, seed=2)
    state = {
        "read_state": ReadState(
            name, cc.info(name).fingerprint, "elements", 2, 0, 1, 3, 4
        ).to_json()
    }
    ds.load_state_dict(state)
    ds.set_epoch(3)
    assert ds.state_dict() == state
    assert len(list(pickle.loads(pickle.dumps(ds)))) == 6  # a worker's copy resumes
    ds.set_epoch(4)
    assert len(list(pickle.loads(pickle.dumps(ds)))) == 10  # the next epoch's, whole
