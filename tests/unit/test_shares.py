"""Elastic resume (client/read/planning/plan.py and shares.py): the states of W workers
resumed by W2; no daemon, no TF. The positions here stand for any order's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.errors import InvalidArgumentError, ResumeMismatchError
from client.read.planning import shares
from client.read.planning.plan import (
    ReadOptions,
    ReadState,
    apply_resume,
    cardinality,
    epoch_range,
    share_of,
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


def positions(runs: shares.Runs) -> list[int]:
    return [p for lo, hi in runs for p in range(lo, hi)]


def split_states(c: SimpleNamespace, workers: int, counts: list[int], **opts) -> list[ReadState]:
    """Each worker of a split after counts[w] elements (from epoch 0, or from opts' resume)."""
    out = []
    for w in range(workers):
        options = ReadOptions(worker_index=w, num_workers=workers, **opts)
        out.append(state_of(c, options, counts[w]))
    return out


def read_by(
    c: SimpleNamespace, states: list[ReadState], epoch: int, remaining: shares.Runs | None = None
) -> list[int]:
    """The positions of epoch the workers of states (a split of remaining) have read."""
    out = []
    for s in states:
        options = ReadOptions(
            worker_index=s.worker_index, num_workers=s.num_workers, remaining=remaining, epoch=epoch
        )
        if s.epoch == epoch:
            out += positions(shares.first(share_of(c, options, epoch), s.start))
        elif s.epoch > epoch:
            out += positions(share_of(c, options, epoch))
    return out


@given(
    n=st.integers(0, 400),
    old=st.integers(1, 9),
    new=st.integers(1, 9),
    fractions=st.lists(st.floats(0, 1), min_size=9, max_size=9),
)
def test_new_shares_are_exactly_the_unread_positions_evenly_split(n, old, new, fractions) -> None:
    c = cache(n)
    share = [
        shares.size(share_of(c, ReadOptions(worker_index=w, num_workers=old), 0))
        for w in range(old)
    ]
    counts = [int(fractions[w] * share[w]) for w in range(old)]  # up to a whole share
    states = split_states(c, old, counts)
    seen = read_by(c, states, 0)
    resumed = [
        apply_resume(c, ReadOptions(worker_index=j, num_workers=new), states) for j in range(new)
    ]
    epoch = resumed[0].epoch
    parts = [positions(share_of(c, options, epoch)) for options in resumed]
    if epoch == 0:
        assert sorted(seen + [p for part in parts for p in part]) == list(range(n))
    else:  # the old split had read all of epoch 0: the new one reads epoch 1 whole
        assert sorted(seen) == list(range(n)) and epoch == 1
        assert sorted(p for part in parts for p in part) == list(range(n))
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1
    for options in resumed:  # the next epoch is the normal split
        assert share_of(c, options, epoch + 1) == share_of(
            c, ReadOptions(worker_index=options.worker_index, num_workers=new), epoch + 1
        )


@given(
    n=st.integers(1, 300),
    sizes=st.lists(st.integers(1, 7), min_size=3, max_size=3),
    fractions=st.lists(st.floats(0, 1), min_size=14, max_size=14),
)
def test_a_resumed_split_resumes_again_with_another_count(n, sizes, fractions) -> None:
    c = cache(n)
    a, b, d = sizes
    first = split_states(c, a, [int(f * (n // a)) for f in fractions[:a]])
    seen = read_by(c, first, 0)
    resumed = [apply_resume(c, ReadOptions(worker_index=j, num_workers=b), first) for j in range(b)]
    if resumed[0].epoch:
        return  # nothing left of epoch 0: covered above
    counts = [int(f * shares.size(share_of(c, o, 0))) for f, o in zip(fractions[7:], resumed)]
    second = [state_of(c, o, k) for o, k in zip(resumed, counts)]
    assert all(s.remaining == resumed[0].remaining for s in second if s.epoch == 0)
    seen += read_by(c, second, 0, resumed[0].remaining)
    again = [apply_resume(c, ReadOptions(worker_index=j, num_workers=d), second) for j in range(d)]
    if again[0].epoch == 0:
        seen += [p for o in again for p in positions(share_of(c, o, 0))]
    assert sorted(seen) == list(range(n))
    for s in second:  # each worker's own state still resumes its own share
        mine = apply_resume(c, ReadOptions(worker_index=s.worker_index, num_workers=b), s)
        assert (mine.epoch, mine.start, mine.remaining) == (s.epoch, s.start, s.remaining)


def test_a_state_of_a_resumed_worker_counts_its_share_then_whole_epochs() -> None:
    c = cache(100)
    states = split_states(c, 4, [10, 0, 25, 3])  # shares of 25: worker 2 finished
    assert (states[2].epoch, states[2].start) == (1, 0)
    options = apply_resume(c, ReadOptions(worker_index=1, num_workers=3), states)
    assert options.remaining == ((10, 50), (78, 100))
    assert share_of(c, options, 0) == ((30, 50), (78, 79))  # 62 unread: 20, 21, 21
    assert cardinality(c, options) == -2
    assert state_of(c, options, 20) == ReadState(
        "c", "fp", "none", 0, 1, 3, 0, 20, ((10, 50), (78, 100))
    )
    assert (state_of(c, options, 21).epoch, state_of(c, options, 21).start) == (1, 0)
    later = state_of(c, options, 21 + 33 + 5)  # the next epochs: shares of 33
    assert (later.epoch, later.start, later.remaining) == (2, 5, None)
    _, runs = epoch_range(c, options, 0, 19)
    assert runs == ((49, 50), (78, 79))
    state = state_of(c, options, 7)
    assert ReadState.from_json(state.to_json()) == state


def test_a_split_that_read_its_whole_epoch_resumes_at_the_next() -> None:
    c = cache(10)
    options = apply_resume(c, ReadOptions(num_workers=3), split_states(c, 2, [5, 5]))
    assert (options.epoch, options.start, options.remaining) == (1, 0, None)
    assert cardinality(c, options) == 3
    untouched = apply_resume(c, ReadOptions(num_workers=3), split_states(c, 2, [0, 0]))
    assert (untouched.epoch, untouched.remaining) == (0, None)  # the whole epoch: no runs


def test_chunks_keep_to_runs_and_cover_them() -> None:
    runs = ((3, 10), (20, 21), (40, 55))
    chunking = shares.Chunking(runs, 4)
    bounds = [chunking.bounds(i) for i in range(chunking.count)]
    assert bounds == [(3, 7), (7, 10), (20, 21), (40, 44), (44, 48), (48, 52), (52, 55)]
    assert shares.Chunking((), 4).count == 0


def test_batches_are_cut_across_runs_with_the_short_last_one_kept_or_dropped() -> None:
    runs = ((3, 10), (20, 21), (40, 45))  # 13 positions
    kept = shares.Batching(runs, shares.Batches(4))
    assert [kept.pieces(i) for i in range(kept.count)] == [
        [(3, 7)],
        [(7, 10), (20, 21)],
        [(40, 44)],
        [(44, 45)],
    ]
    dropped = shares.Batching(runs, shares.Batches(4, drop_remainder=True))
    assert dropped.count == 3
    assert shares.Batching(runs, shares.Batches(13, drop_remainder=True)).pieces(0) == list(runs)
    assert shares.Batching((), shares.Batches(4)).count == 0


def test_grouped_batches_are_whole_ones_with_the_short_last_one_alone() -> None:
    runs = ((3, 10), (20, 21), (40, 45))  # 13 positions: batches of 3, 3, 3, 3 and 1
    kept = shares.Batching(runs, shares.Batches(3, group=3))
    assert [kept.pieces(i) for i in range(kept.count)] == [
        [(3, 10), (20, 21), (40, 41)],
        [(41, 44)],
        [(44, 45)],
    ]
    dropped = shares.Batching(runs, shares.Batches(3, drop_remainder=True, group=3))
    assert [dropped.pieces(i) for i in range(dropped.count)] == [
        [(3, 10), (20, 21), (40, 41)],
        [(41, 44)],
    ]
    exact = shares.Batching(((0, 12),), shares.Batches(3, group=2))
    assert [exact.pieces(i) for i in range(exact.count)] == [[(0, 6)], [(6, 12)]]
    assert shares.Batching((), shares.Batches(4, group=4)).count == 0


def test_a_single_state_of_another_split_says_to_pass_all_of_them() -> None:
    c = cache()
    state = state_of(c, ReadOptions(worker_index=1, num_workers=4), 5)
    with pytest.raises(ResumeMismatchError, match=r"pass the states of all the old workers"):
        apply_resume(c, ReadOptions(worker_index=1, num_workers=3), state)


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (lambda s: s[:3], r"old workers \[3\] of 4 are missing"),
        (lambda s: [*s, s[1]], r"old workers \[1\] are passed more than once"),
        (lambda s: [*s[:3], split_states(cache(), 5, [1] * 5)[3]], r"splits of \[4, 5\] workers"),
        (lambda s: [*s[:3], ReadState("c", "fp", "none", 0, 3, 4, 2, 1)], r"epochs \[0, 2\]"),
        (
            lambda s: [*s[:3], ReadState("c", "fp", "none", 0, 3, 4, 0, 26)],
            r"worker 3's state has start=26, past the end of its share of epoch 0 \(25",
        ),
        (lambda s: [ReadState("d", "fp", "none", 0, 0, 1, 0, 1)], "saved with cache='d'"),
        (
            lambda s: [*s[:3], ReadState("c", "fp2", "none", 0, 3, 4, 0, 1)],
            "saved with fingerprint='fp2'",
        ),
        (
            lambda s: [*s[:3], ReadState("c", "fp", "none", 0, 3, 4, 0, 1, ((0, 50),))],
            "come from different splits",
        ),
        (
            lambda s: [ReadState("c", "fp", "none", 0, 0, 1, 0, 1, ((5, 3),))],
            r"not sorted disjoint runs",
        ),
    ],
)
def test_an_inconsistent_set_of_old_states_is_refused_saying_what_to_pass(states, message) -> None:
    c = cache()
    with pytest.raises((ResumeMismatchError, InvalidArgumentError), match=message):
        apply_resume(c, ReadOptions(num_workers=3), states(split_states(c, 4, [1, 2, 3, 4])))


def test_states_of_another_seed_or_shuffle_are_refused() -> None:
    c = cache()
    states = split_states(c, 2, [3, 4], shuffle=True, seed=7)
    with pytest.raises(ResumeMismatchError, match="pass seed=7"):
        apply_resume(c, ReadOptions(shuffle=True, seed=8, num_workers=3), states)
    with pytest.raises(ResumeMismatchError, match="saved with shuffle='elements'"):
        apply_resume(c, ReadOptions(shuffle="shards", seed=7, num_workers=3), states)
    with pytest.raises(InvalidArgumentError, match="a list of the ReadStates of every worker"):
        apply_resume(c, ReadOptions(shuffle=True, seed=7), [])
    with pytest.raises(InvalidArgumentError, match="either resume= or epoch=/start="):
        apply_resume(c, ReadOptions(shuffle=True, seed=7, epoch=1), states)
