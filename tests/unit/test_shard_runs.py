"""client/read/fetching/fetch.py's shard_runs: the shards holding a range of positions, found
by bisection, exactly as a walk over every shard finds them (empty shards included)."""

from __future__ import annotations

import random

from client._transport import pb
from client.read.fetching.fetch import shard_runs


def _cache(sizes: list[int]) -> pb.Cache:
    cache, first = pb.Cache(name="c"), 0
    for index, n in enumerate(sizes):
        cache.shards.add(index=index, first_element=first, num_elements=n)
        first += n
    return cache


def _walked(cache: pb.Cache, first: int, stop: int) -> list[tuple[int, int, int]]:
    runs = []
    for shard in cache.shards:
        end = shard.first_element + shard.num_elements
        if end > first and shard.first_element < stop:
            start = max(first, shard.first_element)
            runs.append((shard.index, start - shard.first_element, min(stop, end) - start))
    return runs


def test_runs_match_a_walk_over_every_shard_for_any_range() -> None:
    rng = random.Random(5)
    for _ in range(200):
        sizes = [rng.choice([0, 1, 3, 10]) for _ in range(rng.randint(1, 30))]
        cache = _cache(sizes)
        total = sum(sizes)
        first = rng.randint(0, total)
        stop = rng.randint(first, total + 2)
        got = [(s.index, start, count) for s, start, count in shard_runs(cache, first, stop)]
        assert got == _walked(cache, first, stop), (sizes, first, stop)


def test_a_cache_read_again_after_it_changed_is_looked_up_afresh() -> None:
    cache = _cache([4, 4])
    assert [s.index for s, _, _ in shard_runs(cache, 6, 8)] == [1]
    cache.shards.add(index=2, first_element=8, num_elements=4)
    assert [s.index for s, _, _ in shard_runs(cache, 6, 12)] == [1, 2]
