"""Epoch orders: which element of a cache comes at each position of an epoch.

An order is computed, never stored: position p of epoch e maps to a global
element index by a keyed bijection, evaluated for a whole window of positions at
once in numpy. Memory is O(window) (O(shards) for ``"shards"``) however large
the cache.

* ``"none"``: the stored order, p -> p.
* ``"elements"`` (``shuffle=True``): an exact global shuffle. A balanced Feistel
  network over the smallest power of four >= N, keyed by (seed, epoch), made a
  permutation of [0, N) by cycle walking (re-encrypt until the value is < N;
  the domain is < 4N, so under 4 rounds trips on average).
* ``"shards"``: the shards in a keyed order, and within each shard its blocks of
  ``block`` consecutive elements in a keyed order, each block read front to
  back: reads stay sequential in runs of ``block`` elements.

Pure numpy: no TensorFlow, no gRPC. Arithmetic is on uint64 arrays, where
numpy wraps on overflow silently (as these mixing functions need).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

ROUNDS = 6
#: run_indices computes a shuffled order this many positions at a time and keeps the last
#: two windows: the numpy calls of six Feistel rounds and their cycle walks cost about as much
#: for 64 positions (a small batch, ~0.2 ms) as for 4096.
WINDOW = 4096
_U64 = np.uint64
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_GOLDEN = _U64(0x9E3779B97F4A7C15)
MODES = ("none", "elements", "shards")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise: a bijective avalanche of 64-bit words."""
    x = x ^ (x >> _U64(30))
    x = x * _M1
    x = x ^ (x >> _U64(27))
    x = x * _M2
    return x ^ (x >> _U64(31))


def round_keys(seed: int, epoch: int, salt: int = 0) -> np.ndarray:
    """ROUNDS 64-bit keys derived from (seed, epoch, salt) by BLAKE2b."""
    digest = hashlib.blake2b(
        struct.pack("<QQQ", seed, epoch, salt), digest_size=8 * ROUNDS, person=b"shardcache-ord"
    ).digest()
    return np.frombuffer(digest, "<u8").astype(_U64).reshape(ROUNDS, 1)


def half_bits(n: np.ndarray | int) -> np.ndarray:
    """Bits of each Feistel half: the domain 4**h is the smallest power of four >= n."""
    n = np.maximum(np.asarray(n, np.int64), 2)
    bits = np.ceil(np.log2(n.astype(np.float64))).astype(np.int64)
    # float log2 is exact for powers of two, and off by one at worst just below one:
    bits += np.left_shift(np.int64(1), bits) < n
    return ((bits + 1) // 2).astype(_U64)


def _feistel(x: np.ndarray, keys: np.ndarray, h: np.ndarray, inverse: bool) -> np.ndarray:
    mask = (_U64(1) << h) - _U64(1)
    left, right = x >> h, x & mask
    rounds = range(ROUNDS - 1, -1, -1) if inverse else range(ROUNDS)
    for r in rounds:
        if inverse:  # undo: (L, R) = (R, L ^ F(R)) -> L = R' ^ F(L'), R = L'
            left, right = right ^ (_mix(left ^ keys[r]) & mask), left
        else:
            left, right = right, left ^ (_mix(right ^ keys[r]) & mask)
    return (left << h) | right


def permute(
    x: np.ndarray, n: np.ndarray | int, keys: np.ndarray, *, inverse: bool = False
) -> np.ndarray:
    """A keyed permutation of [0, n), applied to every x (elementwise, x < n).

    n and the keys broadcast against x, so one call can permute values of
    different domains (one per shard) with different keys.
    """
    x = np.asarray(x, _U64)
    n_arr = np.broadcast_to(np.asarray(n, _U64), x.shape)
    h = np.broadcast_to(half_bits(n_arr.astype(np.int64)), x.shape)
    keys = np.broadcast_to(keys, (ROUNDS, *x.shape)) if x.ndim else keys
    y = _feistel(x, keys, h, inverse)
    walk = np.flatnonzero(y >= n_arr)
    while walk.size:
        sub = _feistel(y[walk], keys[:, walk], h[walk], inverse)
        y[walk] = sub
        walk = walk[sub >= n_arr[walk]]
    return y


class EpochOrder:
    """The order of one epoch: :meth:`indices` maps positions to element indices."""

    def __init__(
        self, mode: str, seed: int, epoch: int, shard_sizes: Sequence[int], block: int = 1
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown order {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.size = int(sum(shard_sizes))
        self._keys = round_keys(seed, epoch)
        self._stored_sizes = np.asarray(shard_sizes, np.int64)
        self._stored_ends = np.cumsum(self._stored_sizes)
        self._windows: list[tuple[int, np.ndarray]] = []  # (first position, its indices)
        if mode != "shards":
            return
        sizes = np.asarray(shard_sizes, np.int64)
        self._block = max(1, int(block))
        firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        shards = np.arange(len(sizes), dtype=_U64)
        order = permute(shards, len(sizes), self._keys).astype(np.int64) if len(sizes) else shards
        self._shard = order  # shard at each place in the shard order
        self._ends = np.cumsum(sizes[order])  # positions ending each place
        self._starts = self._ends - sizes[order]
        self._first = firsts[order]
        self._n = sizes[order]
        self._blocks = np.maximum(1, -(-self._n // self._block))
        # one key set per shard, derived from the epoch's keys by mixing in the shard
        self._shard_keys = _mix(self._keys ^ ((order.astype(_U64) + _U64(1)) * _GOLDEN))
        last = (self._blocks - 1).astype(_U64)
        self._last_place = permute(last, self._blocks, self._shard_keys, inverse=True).astype(
            np.int64
        )

    def shards(self, runs: Sequence[tuple[int, int]]) -> list[int]:
        """The shards that the positions of runs read, in the order they read them, each
        once; [] for "elements", whose every stretch of positions touches most shards."""
        if self.mode == "elements":
            return []
        stored = self.mode == "none"
        ends = self._stored_ends if stored else self._ends
        sizes = self._stored_sizes if stored else self._n
        out: list[int] = []
        for p0, p1 in runs:
            if p1 <= p0:
                continue
            lo = int(np.searchsorted(ends, p0, side="right"))
            hi = int(np.searchsorted(ends, p1 - 1, side="right"))
            out.extend(i if stored else int(self._shard[i]) for i in range(lo, hi + 1) if sizes[i])
        return list(dict.fromkeys(out))

    def run_indices(self, runs: Sequence[tuple[int, int]]) -> np.ndarray:
        """Global element indices (uint64) at the positions of runs [(p0, p1), ...], in
        order: indices() of whole WINDOWs of positions, kept while the runs walk them."""
        parts = []
        for p0, p1 in runs:
            while p0 < p1:
                start, held = self._window(p0)
                take = min(p1, start + len(held)) - p0
                parts.append(held[p0 - start : p0 - start + take])
                p0 += take
        return np.concatenate(parts) if parts else np.empty(0, _U64)  # a copy, never a view

    def _window(self, p: int) -> tuple[int, np.ndarray]:
        windows = self._windows  # replaced whole, never changed: safe for a pass's threads
        for start, held in windows:
            if start <= p < start + len(held):
                return start, held
        start = p - p % WINDOW
        window = start, self.indices(np.arange(start, min(self.size, start + WINDOW)))
        self._windows = [window, *windows[:1]]
        return window

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Global element indices (uint64) at these positions (int64, each < size)."""
        p = np.asarray(positions, np.int64)
        if self.mode == "none":
            return p.astype(_U64)
        if self.mode == "elements":
            return permute(p.astype(_U64), self.size, self._keys)
        place = np.searchsorted(self._ends, p, side="right")
        q = p - self._starts[place]
        b = self._block
        last_place = self._last_place[place]
        last_size = self._n[place] - (self._blocks[place] - 1) * b
        before = q < last_place * b
        inside = ~before & (q < last_place * b + last_size)
        slot = np.where(before, q // b, (q - last_size) // b + 1)
        offset = np.where(before, q % b, (q - last_size) % b)
        slot = np.where(inside, 0, slot)  # any valid value; replaced below
        keys = self._shard_keys[:, place]
        block = permute(slot.astype(_U64), self._blocks[place], keys).astype(np.int64)
        block = np.where(inside, self._blocks[place] - 1, block)
        offset = np.where(inside, q - last_place * b, offset)
        return (self._first[place] + block * b + offset).astype(_U64)
