"""Epoch orders (client/read/planning/order.py): bijections, determinism, windows, blocks."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from client.read.planning.order import EpochOrder, half_bits, permute, round_keys

shard_sizes = st.lists(st.integers(0, 300), min_size=1, max_size=8).filter(lambda s: sum(s) > 0)
modes = st.sampled_from(["none", "elements", "shards"])
seeds = st.integers(0, 2**64 - 1)


def full(order: EpochOrder) -> list[int]:
    return order.indices(np.arange(order.size)).tolist()


@settings(max_examples=200, deadline=None)
@given(
    sizes=shard_sizes, mode=modes, seed=seeds, epoch=st.integers(0, 10**6), block=st.integers(1, 50)
)
def test_every_order_visits_each_element_exactly_once(sizes, mode, seed, epoch, block) -> None:
    order = EpochOrder(mode, seed, epoch, sizes, block)
    assert sorted(full(order)) == list(range(sum(sizes)))


@settings(max_examples=50, deadline=None)
@given(
    sizes=shard_sizes,
    mode=modes,
    seed=seeds,
    epoch=st.integers(0, 1000),
    block=st.integers(1, 50),
    data=st.data(),
)
def test_a_window_of_positions_matches_the_whole_order(
    sizes, mode, seed, epoch, block, data
) -> None:
    order = EpochOrder(mode, seed, epoch, sizes, block)
    lo = data.draw(st.integers(0, order.size - 1))
    hi = data.draw(st.integers(lo, order.size))
    assert order.indices(np.arange(lo, hi)).tolist() == full(order)[lo:hi]


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=4).filter(lambda s: sum(s) > 0),
    mode=modes,
    seed=seeds,
    block=st.integers(1, 50),
    data=st.data(),
)
def test_runs_of_positions_read_through_windows_match_the_whole_order(
    sizes, mode, seed, block, data
) -> None:
    """run_indices keeps WINDOW positions of the order at a time: runs inside one window,
    across its edges, backwards and repeated all give the order's own indices."""
    order = EpochOrder(mode, seed, 3, sizes, block)
    whole = full(order)
    bounds = st.integers(0, order.size)
    for _ in range(4):
        runs = [tuple(sorted((data.draw(bounds), data.draw(bounds)))) for _ in range(3)]
        want = [i for p0, p1 in runs for i in whole[p0:p1]]
        got = order.run_indices(runs)
        assert got.dtype == np.uint64 and got.tolist() == want


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 10**12),
    seed=seeds,
    epoch=st.integers(0, 10**6),
    x=st.lists(st.integers(0, 10**12), min_size=1, max_size=50),
)
def test_the_inverse_undoes_the_permutation_on_huge_domains(n, seed, epoch, x) -> None:
    keys = round_keys(seed, epoch)
    values = np.array([v % n for v in x], np.uint64)
    forward = permute(values, n, keys)
    assert (forward < n).all()
    assert permute(forward, n, keys, inverse=True).tolist() == values.tolist()


@given(n=st.integers(1, 2**62))
def test_the_feistel_domain_is_the_smallest_power_of_four_at_least_n(n) -> None:
    h = int(half_bits(n))
    assert 4**h >= n
    assert h == 1 or 4 ** (h - 1) < n


@given(seed=seeds, epoch=st.integers(0, 10**6), mode=st.sampled_from(["elements", "shards"]))
def test_the_same_seed_and_epoch_give_the_same_order(seed, epoch, mode) -> None:
    sizes = [500, 120, 380]
    assert full(EpochOrder(mode, seed, epoch, sizes, 7)) == full(
        EpochOrder(mode, seed, epoch, sizes, 7)
    )


@given(seed=seeds, epoch=st.integers(0, 10**6))
def test_another_epoch_or_seed_gives_another_order(seed, epoch) -> None:
    sizes = [700, 300]
    base = full(EpochOrder("elements", seed, epoch, sizes))
    assert base != full(EpochOrder("elements", seed, epoch + 1, sizes))
    assert base != full(EpochOrder("elements", (seed + 1) % 2**64, epoch, sizes))
    assert base != sorted(base)


def test_a_global_shuffle_mixes_elements_across_the_whole_cache() -> None:
    order = np.array(full(EpochOrder("elements", 7, 0, [10_000] * 10)))
    first_tenth = order[:10_000]
    # every shard contributes to the first tenth of the epoch, about equally
    counts = np.bincount(first_tenth // 10_000, minlength=10)
    assert counts.min() > 800 and counts.max() < 1200


@settings(max_examples=50, deadline=None)
@given(sizes=shard_sizes, seed=seeds, block=st.integers(1, 50))
def test_shard_order_reads_blocks_front_to_back_within_one_shard(sizes, seed, block) -> None:
    order = full(EpochOrder("shards", seed, 3, sizes, block))
    firsts = np.concatenate([[0], np.cumsum(sizes)])
    shard_of = np.searchsorted(firsts, order, side="right") - 1
    # each shard's elements are contiguous in the epoch, and runs of consecutive
    # indices break only at block boundaries
    changes = [s for i, s in enumerate(shard_of) if i == 0 or shard_of[i - 1] != s]
    assert len(changes) == len(set(changes))
    for prev, cur in itertools.pairwise(order):
        if cur != prev + 1:
            assert (cur - firsts[np.searchsorted(firsts, cur, side="right") - 1]) % block == 0


def test_the_stored_order_is_the_identity() -> None:
    assert full(EpochOrder("none", 1, 2, [3, 0, 4])) == list(range(7))


def test_an_empty_cache_has_an_empty_order_in_every_mode() -> None:
    for mode in ("none", "elements", "shards"):
        for sizes in ([], [0], [0, 0]):
            assert full(EpochOrder(mode, 1, 0, sizes, 4)) == []


@settings(max_examples=200, deadline=None)
@given(
    sizes=shard_sizes,
    mode=st.sampled_from(["none", "shards"]),
    seed=seeds,
    block=st.integers(1, 50),
    cuts=st.lists(st.floats(0, 1), min_size=2, max_size=6),
)
def test_the_shards_of_runs_are_those_their_positions_read_in_that_order(
    sizes, mode, seed, block, cuts
) -> None:
    order = EpochOrder(mode, seed, 3, sizes, block)
    bounds = sorted(int(c * order.size) for c in cuts)
    runs = list(zip(bounds[::2], bounds[1::2]))
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    read = [
        int(np.searchsorted(firsts, i, side="right") - 1)
        for p0, p1 in runs
        for i in order.indices(np.arange(p0, p1)).tolist()
    ]
    assert order.shards(runs) == list(dict.fromkeys(read))


def test_an_exact_shuffle_names_no_shard_order() -> None:
    assert EpochOrder("elements", 1, 0, [5, 5]).shards([(0, 10)]) == []
