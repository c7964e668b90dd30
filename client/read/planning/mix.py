"""A weighted mix of caches: which source and which of its elements each position holds.

A mixed epoch has ``size`` positions (default: the sources' elements together).
Source i gets exactly ``n_i`` of them, its weight's share of ``size`` rounded by
largest remainder (ties to the name first in sorted order), so every epoch holds
the same counts. The epoch's order is computed, never stored, from (seed, epoch):

* Position p maps by a keyed permutation of ``[0, size)`` (order.permute) to a
  slot q of the sources' draws laid end to end (source 0's n_0 draws, then
  source 1's, ... in name order): slot q is draw j of source i. The sources are
  interleaved at random, in exact counts, at every scale.
* Source i is read as an endless run of its own passes, each a whole epoch of
  that source in the read's shuffle mode (``False``: the stored order; ``True``,
  ``"shards"``: order.EpochOrder, keyed by a seed of the source's own). Mixed
  epoch e takes draws ``[e*n_i, (e+1)*n_i)`` of that run: without replacement
  until a pass is used up, then the next pass. After the first k epochs every
  element of source i has been drawn ``k*n_i // s_i`` times or once more.

Memory: per source its counts, seed and shard sizes (O(sources + shards)); a
window of positions costs O(window). Pure numpy: no TensorFlow, no gRPC.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from client.errors import InvalidArgumentError, ResumeMismatchError
from client.read.planning.order import EpochOrder, permute, round_keys
from client.read.planning.plan import SHARD_BLOCK_BYTES, ReadState, Resume

#: Salt of the interleave's round keys: never the keys of a source's own order.
_MIX_SALT = 0x6D6978


def _derived(seed: int, label: str) -> int:
    digest = hashlib.blake2b(
        struct.pack("<Q", seed) + label.encode(), digest_size=8, person=b"shardcache-mix"
    ).digest()
    return int.from_bytes(digest, "little") >> 1


def apportion(weights: Sequence[Fraction], size: int) -> list[int]:
    """size split in proportion to weights, by largest remainder (ties: the first)."""
    total = sum(weights)
    exact = [w * size / total for w in weights]
    counts = [int(x) for x in exact]  # floor: all non-negative
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: size - sum(counts)]:
        counts[i] += 1
    return counts


def weight_of(name: str, weight: Any) -> Fraction:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise InvalidArgumentError(
            f"the weight of cache {name!r} must be a number, got {type(weight).__name__} {weight!r}"
        )
    if not (weight > 0 and np.isfinite(weight)):
        raise InvalidArgumentError(
            f"the weight of cache {name!r} must be a finite number > 0, "
            f"got {weight!r}; leave a cache out to not read it"
        )
    return Fraction(weight)


@dataclass(frozen=True)
class Mix:
    """The caches of a mix and what each epoch takes of them; read/plan.py's functions take
    it as the cache they read (name, fingerprint, num_elements: the epoch's size)."""

    name: str
    fingerprint: str
    num_elements: int
    sources: tuple[Any, ...]  # pb.Cache, by name
    counts: tuple[int, ...]  # draws of each source per epoch
    seed: int

    @property
    def stored_bytes(self) -> float:
        """Stored bytes of an epoch, as each source's average element times its draws."""
        return sum(
            c.stored_bytes / max(c.num_elements, 1) * n for c, n in zip(self.sources, self.counts)
        )


def plan(caches: Sequence[Any], weights: Mapping[str, Any], size: int | None, seed: int) -> Mix:
    """The Mix of caches (READY, in name order) with these weights, epochs of size elements
    (None: all the sources' elements together)."""
    fractions = [weight_of(c.name, weights[c.name]) for c in caches]
    if size is None:
        size = sum(c.num_elements for c in caches)
    elif isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgumentError(f"size must be an int >= 0 (elements per epoch), got {size!r}")
    counts = apportion(fractions, size)
    for cache, n in zip(caches, counts):
        if n and not cache.num_elements:
            raise InvalidArgumentError(
                f"cache {cache.name!r} is empty, so it cannot give the {n} elements its "
                "weight asks of each epoch; leave it out of the mix"
            )
    name = "mix(" + ",".join(f"{c.name}={n}" for c, n in zip(caches, counts)) + ")"
    h = hashlib.blake2b(digest_size=8, person=b"shardcache-mix")
    for cache, n in zip(caches, counts):
        h.update(f"{cache.name}\0{cache.fingerprint}\0{n}\0".encode())
    return Mix(name, h.hexdigest(), size, tuple(caches), tuple(counts), seed)


def check_weights(weights: Any) -> dict[str, Any]:
    """weights as given to cc.mix(): a non-empty mapping of cache names to weights."""
    if not isinstance(weights, Mapping) or not weights:
        raise InvalidArgumentError(
            f"mix() takes a dict of cache names to weights, e.g. "
            f"{{'web': 3, 'books': 1}}, got {weights!r:.80}"
        )
    for name, weight in weights.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"mix() takes cache names as keys, got {name!r}")
        weight_of(name, weight)
    return dict(weights)


def check_seed(seed: int, resume: Resume) -> None:
    """A mix's order depends on its seed whatever the shuffle mode: refuse another seed's
    states (plan.apply_resume checks the rest)."""
    states = (
        [resume]
        if isinstance(resume, ReadState)
        else (resume if isinstance(resume, (list, tuple)) else [])
    )
    for state in states:
        if isinstance(state, ReadState) and state.seed != seed:
            raise ResumeMismatchError(
                f"cannot resume: the state was saved with seed={state.seed}, this mix has "
                f"seed={seed}; the orders differ, so resuming would repeat and skip "
                f"elements: pass seed={state.seed}"
            )


class MixOrder:
    """The order of one mixed epoch: :meth:`pairs` maps positions to (source, element)."""

    def __init__(self, mix: Mix, mode: str, epoch: int) -> None:
        self._mix = mix
        self._mode = mode
        self._epoch = epoch
        self._keys = round_keys(mix.seed, epoch, _MIX_SALT)
        counts = np.asarray(mix.counts, np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self._counts = counts
        self._sizes = np.asarray([c.num_elements for c in mix.sources], np.int64)
        self._seeds = [_derived(mix.seed, c.name) for c in mix.sources]

    def pairs(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source number, global element index in that source) at each position."""
        p = np.asarray(positions, np.int64)
        q = permute(p.astype(np.uint64), self._mix.num_elements, self._keys).astype(np.int64)
        source = np.searchsorted(self._ends, q, side="right")
        draw = self._epoch * self._counts[source] + (q - self._starts[source])
        sizes = self._sizes[source]
        passes, offset = np.divmod(draw, np.maximum(sizes, 1))
        if self._mode == "none":
            return source, offset.astype(np.uint64)
        element = np.empty(len(p), np.uint64)
        if not len(p):
            return source, element
        group = source * (int(passes.max()) + 1) + passes  # one per (source, pass)
        by_group = np.argsort(group, kind="stable")
        cuts = np.flatnonzero(np.diff(group[by_group])) + 1
        for where in np.split(by_group, cuts):
            s, pass_ = int(source[where[0]]), int(passes[where[0]])
            element[where] = self._order(s, pass_).indices(offset[where])
        return source, element

    def _order(self, s: int, pass_: int) -> EpochOrder:
        cache = self._mix.sources[s]
        avg = cache.stored_bytes / cache.num_elements if cache.num_elements else 1.0
        block = max(1, int(SHARD_BLOCK_BYTES // max(avg, 1.0)))
        return EpochOrder(
            self._mode, self._seeds[s], pass_, [shard.num_elements for shard in cache.shards], block
        )
