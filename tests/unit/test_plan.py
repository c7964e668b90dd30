"""Read options, worker shares, resume states (client/read/planning/plan.py); no daemon, no TF."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.errors import InvalidArgumentError, ResumeMismatchError
from client.read.planning.plan import (
    ReadOptions,
    ReadState,
    apply_resume,
    cardinality,
    check_start,
    share_range,
    state_of,
)


def cache(n: int = 100, name: str = "c", fingerprint: str = "fp") -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        fingerprint=fingerprint,
        num_elements=n,
        stored_bytes=n * 10,
        shards=[SimpleNamespace(num_elements=n)],
    )


@given(n=st.integers(0, 10**6), workers=st.integers(1, 64))
def test_worker_shares_are_disjoint_complete_and_differ_by_at_most_one(n, workers) -> None:
    ranges = [share_range(n, w, workers) for w in range(workers)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"worker_index": 3, "num_workers": 3}, "worker_index 3 is out of range"),
        ({"worker_index": -1, "num_workers": 2}, "worker_index must be >= 0"),
        ({"num_workers": 0}, "num_workers must be >= 1"),
        ({"parallel_shards": -1}, "parallel_shards must be >= 0"),
        ({"epoch": -1}, "epoch must be >= 0"),
        ({"start": -5}, "start must be >= 0"),
        ({"shuffle": True, "seed": "7"}, "seed must be an int, got str"),
        ({"shuffle": True, "seed": 1.5}, "seed must be an int, got float"),
        ({"shuffle": True, "seed": True}, "seed must be an int, got bool"),
        ({"shuffle": True, "seed": -1}, "seed must be >= 0"),
        ({"shuffle": True, "seed": 2**64}, "seed must fit in 64 bits"),
        ({"shuffle": "blocks"}, "shuffle must be False, True or 'shards'"),
        ({"shuffle": True, "num_workers": 2}, "needs seed="),
        ({"reconnect_timeout": -1}, "reconnect_timeout must be"),
        ({"reconnect_timeout": float("inf")}, "reconnect_timeout must be"),
    ],
)
def test_bad_options_are_refused_with_a_message_saying_what_to_pass(kwargs, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as info:
        ReadOptions(**kwargs)
    assert isinstance(info.value, ValueError)


def test_a_shuffle_without_a_seed_draws_one_and_keeps_it() -> None:
    options = ReadOptions(shuffle=True).with_seed()
    assert isinstance(options.seed, int)
    assert options.with_seed() is options


def test_start_past_the_share_is_refused() -> None:
    check_start(cache(10), ReadOptions(start=10))
    with pytest.raises(InvalidArgumentError, match="past the end of this worker's share"):
        check_start(cache(10), ReadOptions(start=6, num_workers=2))


def test_cardinality_is_the_share_and_unknown_when_the_first_epoch_is_resumed() -> None:
    assert cardinality(cache(10), ReadOptions(worker_index=0, num_workers=3)) == 3
    assert cardinality(cache(10), ReadOptions(worker_index=2, num_workers=3)) == 4
    assert cardinality(cache(10), ReadOptions(start=2)) == -2


def test_a_state_counts_epochs_of_this_workers_share() -> None:
    options = ReadOptions(shuffle=True, seed=7, worker_index=1, num_workers=4)
    state = state_of(cache(10), options, elements_seen=7)  # share: positions 2..4 (3)
    assert (state.epoch, state.start) == (2, 1)
    assert ReadState.from_json(state.to_json()) == state
    resumed = apply_resume(cache(10), options, state)
    assert (resumed.epoch, resumed.start) == (2, 1)


@pytest.mark.parametrize(
    ("change", "label"),
    [
        ({"name": "other"}, "cache"),
        ({"fingerprint": "fp2"}, "fingerprint"),
    ],
)
def test_resuming_a_state_of_another_cache_is_refused(change, label) -> None:
    options = ReadOptions(shuffle=True, seed=7)
    state = state_of(cache(), options, 5)
    with pytest.raises(ResumeMismatchError, match=f"saved with {label}="):
        apply_resume(cache(**change), options, state)


@pytest.mark.parametrize(
    ("options", "label"),
    [
        (ReadOptions(shuffle=True, seed=8), "seed"),
        (ReadOptions(shuffle="shards", seed=7), "shuffle"),
        (ReadOptions(shuffle=True, seed=7, num_workers=2), "num_workers"),
        (ReadOptions(shuffle=True, seed=7, num_workers=2, worker_index=1), "worker_index"),
    ],
)
def test_resuming_a_state_of_another_order_is_refused(options, label) -> None:
    state = state_of(cache(), ReadOptions(shuffle=True, seed=7), 5)
    with pytest.raises(ResumeMismatchError, match=f"saved with {label}="):
        apply_resume(cache(), options, state)


def test_resume_and_an_explicit_start_together_are_refused() -> None:
    state = state_of(cache(), ReadOptions(), 5)
    with pytest.raises(InvalidArgumentError, match="either resume= or epoch=/start="):
        apply_resume(cache(), ReadOptions(start=1), state)


def test_a_state_that_is_not_json_of_a_state_says_so() -> None:
    with pytest.raises(InvalidArgumentError, match="not a shardcache ReadState"):
        ReadState.from_json('{"epoch": 1}')
