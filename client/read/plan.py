"""What one worker reads in each epoch: options, worker shares, resume states.

An epoch's order (client/read/order.py) lists all N elements. Worker w of W owns
the contiguous run of positions ``[w*N//W, (w+1)*N//W)`` of that order: shares
are disjoint, cover every position, and differ in size by at most one (the
"uneven" policy: nothing dropped, nothing padded). Contiguous runs keep
``shuffle=False`` and ``shuffle="shards"`` reads sequential on disk.

Validation happens here, when ``cc.dataset()`` / ``cc.cache()`` is called, so
bad options fail before TensorFlow iterates anything.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from dataclasses import asdict, dataclass
from typing import Any

from client.errors import InvalidArgumentError, ResumeMismatchError
from client.read.order import EpochOrder

#: shuffle="shards" reads blocks of about this many stored bytes front to back.
SHARD_BLOCK_BYTES = 1 << 20
DEFAULT_RECONNECT_TIMEOUT = 60.0
_MODES = {False: "none", True: "elements", "shards": "shards"}


def _int(name: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} "
                                   f"{value!r}")
    if value < low:
        raise InvalidArgumentError(f"{name} must be >= {low}, got {value}")
    return value


def share_range(num_elements: int, worker_index: int, num_workers: int) -> tuple[int, int]:
    """The positions [lo, hi) of an epoch's order that this worker reads."""
    return (worker_index * num_elements // num_workers,
            (worker_index + 1) * num_elements // num_workers)


@dataclass(frozen=True)
class ReadOptions:
    """The read options of cc.dataset() / cc.cache(), checked on construction."""

    shuffle: bool | str = False
    seed: int | None = None
    worker_index: int = 0
    num_workers: int = 1
    parallel_shards: int = 0  # chunks in flight; 0: tf.data's AUTOTUNE picks
    epoch: int = 0
    start: int = 0
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT

    def __post_init__(self) -> None:
        if not (self.shuffle is True or self.shuffle is False or self.shuffle == "shards"):
            raise InvalidArgumentError(f"shuffle must be False, True or 'shards', got "
                                       f"{self.shuffle!r}")
        _int("num_workers", self.num_workers, 1)
        _int("worker_index", self.worker_index)
        if self.worker_index >= self.num_workers:
            raise InvalidArgumentError(
                f"worker_index {self.worker_index} is out of range for num_workers="
                f"{self.num_workers}: pass 0 <= worker_index < num_workers (your rank)")
        _int("parallel_shards", self.parallel_shards)
        _int("epoch", self.epoch)
        _int("start", self.start)
        if self.seed is not None:
            _int("seed", self.seed)
            if self.seed >= 1 << 64:
                raise InvalidArgumentError(f"seed must fit in 64 bits, got {self.seed}")
        elif self.shuffle and self.num_workers > 1:
            raise InvalidArgumentError(
                "shuffling across workers needs seed=: every worker must compute the same "
                "order, or their shares overlap")
        timeout = self.reconnect_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                timeout >= 0 and math.isfinite(timeout)):
            raise InvalidArgumentError(f"reconnect_timeout must be a finite number of seconds "
                                       f">= 0, got {timeout!r}")

    @property
    def mode(self) -> str:
        return _MODES[self.shuffle]  # type: ignore[index]

    def with_seed(self) -> ReadOptions:
        """These options with a fixed seed: a random one when shuffling without one."""
        if self.seed is not None or not self.shuffle:
            return self
        return _replace(self, seed=secrets.randbits(63))

    @property
    def whole_epochs(self) -> bool:
        """True when every iteration yields every element (one worker, not resumed)."""
        return self.num_workers == 1 and self.start == 0


def _replace(options: ReadOptions, **changes: Any) -> ReadOptions:
    return ReadOptions(**{**asdict(options), **changes})


@dataclass(frozen=True)
class ReadState:
    """Where a worker is in its reading of a cache: enough to resume exactly.

    Save ``state.to_json()`` in a checkpoint; pass ``resume=ReadState.from_json(s)``
    to cc.dataset(). Get one from ``cc.read_state(name, elements_seen=..., ...)``.
    """

    cache: str
    fingerprint: str
    shuffle: str  # "none", "elements" or "shards"
    seed: int
    worker_index: int
    num_workers: int
    epoch: int
    start: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReadState:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"not a shardcache ReadState: {exc}") from exc


def state_of(cache: Any, options: ReadOptions, elements_seen: int) -> ReadState:
    """The ReadState after this worker has consumed elements_seen elements since epoch 0."""
    _int("elements_seen", elements_seen)
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    share = hi - lo
    epoch, start = divmod(elements_seen, share) if share else (0, 0)
    return ReadState(cache.name, cache.fingerprint, options.mode, options.seed or 0,
                     options.worker_index, options.num_workers, epoch, start)


def apply_resume(cache: Any, options: ReadOptions, state: ReadState | None) -> ReadOptions:
    """options resumed at state, after checking that state belongs to this read."""
    if state is None:
        return options
    if not isinstance(state, ReadState):
        raise InvalidArgumentError(f"resume must be a ReadState, got {type(state).__name__}")
    if options.epoch or options.start:
        raise InvalidArgumentError("pass either resume= or epoch=/start=, not both")
    theirs = (state.cache, state.fingerprint, state.shuffle, state.worker_index,
              state.num_workers)
    ours = (cache.name, cache.fingerprint, options.mode, options.worker_index,
            options.num_workers)
    labels = ("cache", "fingerprint", "shuffle", "worker_index", "num_workers")
    for label, a, b in zip(labels, theirs, ours):
        if a != b:
            raise ResumeMismatchError(
                f"cannot resume: the state was saved with {label}={a!r}, this read has "
                f"{label}={b!r}; resume with the options the state was saved under (or "
                "start the epoch afresh without resume=)")
    if options.mode != "none" and options.seed != state.seed:
        raise ResumeMismatchError(
            f"cannot resume: the state was saved with seed={state.seed}, this read has "
            f"seed={options.seed}; the orders differ, so resuming would repeat and skip "
            "elements")
    return _replace(options, epoch=state.epoch, start=state.start)


class Epochs:
    """Which epoch (and start) each iteration of one dataset reads: e, e+1, e+2, ..."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._next = options.epoch
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int]:
        """(epoch, start) of the next iteration; only the first starts at options.start."""
        with self._lock:
            epoch, self._next = self._next, self._next + 1
        return epoch, self.options.start if epoch == self.options.epoch else 0

    def seen(self, epoch: int) -> None:
        """An iteration reads epoch (a restored checkpoint's): the next one reads a later one."""
        with self._lock:
            self._next = max(self._next, epoch + 1)


def check_start(cache: Any, options: ReadOptions) -> None:
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    if options.start > hi - lo:
        raise InvalidArgumentError(
            f"start={options.start} is past the end of this worker's share of cache "
            f"{cache.name!r} ({hi - lo} elements per epoch)")


def cardinality(cache: Any, options: ReadOptions) -> int:
    """What every iteration yields; -2 (unknown) when the first one is resumed mid-epoch."""
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    return -2 if options.start else hi - lo


def epoch_range(cache: Any, options: ReadOptions, epoch: int, start: int
                ) -> tuple[EpochOrder, int, int]:
    """The order of epoch and the positions [first, stop) this worker reads in it."""
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    avg = cache.stored_bytes / cache.num_elements if cache.num_elements else 1.0
    block = max(1, int(SHARD_BLOCK_BYTES // max(avg, 1.0)))
    order = EpochOrder(options.mode, options.seed or 0, epoch,
                       [s.num_elements for s in cache.shards], block)
    return order, lo + start, hi
