"""What one worker reads in each epoch: options, worker shares, resume states.

An epoch's order (client/read/planning/order.py) lists all N elements. Worker w of W owns
the contiguous run of positions ``[w*N//W, (w+1)*N//W)`` of that order: shares
are disjoint, cover every position, and differ in size by at most one (the
"uneven" policy: nothing dropped, nothing padded). Contiguous runs keep
``shuffle=False`` and ``shuffle="shards"`` reads sequential on disk. An elastic
resume divides what an interrupted split left unread of its epoch the same way,
among any number of workers (client/read/planning/shares.py).

Validation happens here, when ``cc.dataset()`` / ``cc.cache()`` is called, so
bad options fail before TensorFlow iterates anything.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from client.errors import InvalidArgumentError, ResumeMismatchError
from client.read.planning import shares
from client.read.planning.order import EpochOrder
from client.read.planning.shares import Runs

#: shuffle="shards" reads blocks of about this many stored bytes front to back.
SHARD_BLOCK_BYTES = 1 << 20
DEFAULT_RECONNECT_TIMEOUT = 60.0
#: prefetch_bytes= when not given: chunks of prefetch_bytes / 8 stored bytes, at most 4 MiB.
DEFAULT_PREFETCH_BYTES = 256 << 20
_MODES = {False: "none", True: "elements", "shards": "shards"}


def _int(name: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise InvalidArgumentError(f"{name} must be >= {low}, got {value}")
    return value


def share_range(num_elements: int, worker_index: int, num_workers: int) -> tuple[int, int]:
    """The positions [lo, hi) of an epoch's order that this worker reads."""
    return (
        worker_index * num_elements // num_workers,
        (worker_index + 1) * num_elements // num_workers,
    )


@dataclass(frozen=True)
class ReadOptions:
    """The reading keywords of every reader (cc.dataset(), cc.cache(), cc.mix(), cc.numpy(),
    cc.torch(), cc.source()), checked on construction: the one value a read is opened with
    (client/read/opening.py). The public methods declare these keywords with these
    defaults (a test holds them to it) and build this value with :meth:`of`."""

    shuffle: bool | str = False
    seed: int | None = None
    worker_index: int = 0
    num_workers: int = 1
    parallel_shards: int = 0  # chunks in flight; 0: tf.data's AUTOTUNE picks
    epoch: int = 0
    start: int = 0
    #: A ReadState, or the states of every worker of a split (an elastic resume); applied
    #: (and cleared) when the read is opened.
    resume: Resume = None
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT
    #: "auto", True or False; None: $SHARDCACHE_DIRECT, resolved when the read is opened.
    direct: bool | str | None = None
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    #: Batches of this many elements (the NumPy and PyTorch readers; cc.dataset()'s Keras
    #: resume counts them); None: elements.
    batch_size: int | None = None
    drop_remainder: bool = False
    #: The positions of epoch ``epoch`` this split divides (None: all of them): what an
    #: interrupted split left unread, set by an elastic resume (apply_resume).
    remaining: Runs | None = None

    @classmethod
    def of(cls, keywords: Mapping[str, Any]) -> ReadOptions:
        """The options among keywords (a public method's locals()): the one place a reader's
        keywords become its options."""
        return cls(**{f.name: keywords[f.name] for f in fields(cls) if f.name in keywords})

    def __post_init__(self) -> None:
        if not (self.shuffle is True or self.shuffle is False or self.shuffle == "shards"):
            raise InvalidArgumentError(
                f"shuffle must be False, True or 'shards', got {self.shuffle!r}"
            )
        _int("num_workers", self.num_workers, 1)
        _int("worker_index", self.worker_index)
        if self.worker_index >= self.num_workers:
            raise InvalidArgumentError(
                f"worker_index {self.worker_index} is out of range for num_workers="
                f"{self.num_workers}: pass 0 <= worker_index < num_workers (your rank)"
            )
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
                "order, or their shares overlap"
            )
        timeout = self.reconnect_timeout
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (timeout >= 0 and math.isfinite(timeout))
        ):
            raise InvalidArgumentError(
                f"reconnect_timeout must be a finite number of seconds >= 0, got {timeout!r}"
            )
        if not (
            self.direct is None
            or self.direct is True
            or self.direct is False
            or self.direct == "auto"
        ):
            raise InvalidArgumentError(f"direct must be 'auto', True or False, got {self.direct!r}")
        _int("prefetch_bytes", self.prefetch_bytes, 1)
        if self.batch_size is not None:
            _int("batch_size", self.batch_size, 1)
        if not isinstance(self.drop_remainder, bool):
            raise InvalidArgumentError(
                f"drop_remainder must be True or False, got {self.drop_remainder!r}"
            )

    @property
    def mode(self) -> str:
        return _MODES[self.shuffle]  # type: ignore[index]

    def with_seed(self) -> ReadOptions:
        """These options with a fixed seed: a random one when shuffling without one."""
        if self.seed is not None or not self.shuffle:
            return self
        return replace(self, seed=secrets.randbits(63))

    @property
    def whole_epochs(self) -> bool:
        """True when every iteration yields every element (one worker, not resumed)."""
        return self.num_workers == 1 and self.start == 0 and self.remaining is None


@dataclass(frozen=True)
class ReadState:
    """Where a worker is in its reading of a cache: enough to resume exactly.

    Save ``state.to_json()`` in a checkpoint; pass ``resume=ReadState.from_json(s)``
    to cc.dataset(). Get one from ``cc.read_state(name, elements_seen=..., ...)``.

    Worker worker_index of num_workers has read the first start positions of
    its share of epoch; remaining, when not None, are the positions of that
    epoch the split divides (what an earlier split left unread), else all.
    """

    cache: str
    fingerprint: str
    shuffle: str  # "none", "elements" or "shards"
    seed: int
    worker_index: int
    num_workers: int
    epoch: int
    start: int
    remaining: Runs | None = None

    def __post_init__(self) -> None:  # JSON gives lists
        if self.remaining is not None and not isinstance(self.remaining, tuple):
            try:
                runs = tuple((lo, hi) for lo, hi in self.remaining)
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"not a shardcache ReadState: remaining="
                    f"{self.remaining!r} is not a list of runs"
                ) from exc
            object.__setattr__(self, "remaining", runs)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReadState:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"not a shardcache ReadState: {exc}") from exc


#: What resume= takes: a worker's own state, or the states of every worker of a split.
Resume = ReadState | Sequence[ReadState] | None


def state_of(cache: Any, options: ReadOptions, elements_seen: int) -> ReadState:
    """The ReadState after this worker has consumed elements_seen elements of a dataset read
    with options: from epoch 0, or from where options resume (apply_resume)."""
    _int("elements_seen", elements_seen)
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    share = hi - lo
    left = shares.size(share_of(cache, options, options.epoch)) - options.start
    if elements_seen < left or not share:
        epoch, start = options.epoch, options.start + min(elements_seen, left)
        remaining = options.remaining
    else:
        epoch, start = divmod(elements_seen - left, share)
        epoch, remaining = options.epoch + 1 + epoch, None
    return ReadState(
        cache.name,
        cache.fingerprint,
        options.mode,
        options.seed or 0,
        options.worker_index,
        options.num_workers,
        epoch,
        start,
        remaining,
    )


def apply_resume(cache: Any, options: ReadOptions, resume: Resume) -> ReadOptions:
    """options resumed at resume, after checking that it belongs to this read.

    resume is one ReadState (this worker's, of the same split), or a list of the
    states of every worker of an earlier split (an elastic resume).
    """
    if resume is None:
        return options
    if options.epoch or options.start:
        raise InvalidArgumentError("pass either resume= or epoch=/start=, not both")
    if isinstance(resume, ReadState):
        _check_order(cache, options, resume)
        theirs, ours = (
            (resume.worker_index, resume.num_workers),
            (options.worker_index, options.num_workers),
        )
        for label, a, b in zip(("worker_index", "num_workers"), theirs, ours):
            if a != b:
                raise ResumeMismatchError(
                    f"cannot resume: the state was saved with {label}={a!r}, this read has "
                    f"{label}={b!r}; resume with the worker split the state was saved under, "
                    "or pass the states of all the old workers as a list (resume=[...]) to "
                    "split what they left unread among this split's workers"
                )
        remaining = _remaining(cache, resume)
        return replace(options, epoch=resume.epoch, start=resume.start, remaining=remaining)
    if isinstance(resume, (str, bytes)) or not isinstance(resume, Sequence) or not resume:
        raise InvalidArgumentError(
            f"resume must be a ReadState or a list of the ReadStates of every worker of the "
            f"interrupted split, got {type(resume).__name__} {resume!r:.80}"
        )
    for state in resume:
        if not isinstance(state, ReadState):
            raise InvalidArgumentError(
                f"resume= lists a {type(state).__name__}, not a "
                "ReadState: pass each old worker's ReadState"
            )
        _check_order(cache, options, state)
    epoch, left = _unread(cache, list(resume))
    if not left:  # the old split had read the whole epoch
        return replace(options, epoch=epoch + 1)
    whole = left == ((0, cache.num_elements),)
    return replace(options, epoch=epoch, remaining=None if whole else left)


def _unread(cache: Any, states: list[ReadState]) -> tuple[int, Runs]:
    """The interrupted epoch of an old split and its positions none of its workers read,
    from one state per old worker (checked: one split, every worker once, one epoch)."""
    splits = sorted({s.num_workers for s in states})
    if len(splits) > 1:
        raise ResumeMismatchError(
            f"cannot resume: the states come from splits of {splits} workers; pass the "
            "states of one split, one per old worker"
        )
    old = splits[0]
    indices = [s.worker_index for s in states]
    twice = sorted({i for i in indices if indices.count(i) > 1})
    missing = sorted(set(range(old)) - set(indices))
    if twice or missing or not set(indices) <= set(range(old)):
        problem = (
            f"the states of old workers {twice} are passed more than once"
            if twice
            else f"the states of old workers {missing} of {old} are missing"
            if missing
            else f"worker_index {max(indices)} is out of range for {old} workers"
        )
        raise ResumeMismatchError(
            f"cannot resume: {problem}; pass the last state of every worker of the old "
            f"split, each once (worker_index 0..{old - 1}), or what they left unread would "
            "be skipped or read twice"
        )
    epoch = min(s.epoch for s in states)
    # a worker that consumed its share exactly is at (epoch + 1, 0): the end of epoch
    ended = [s for s in states if s.epoch == epoch + 1 and s.start == 0 and s.remaining is None]
    within = [s for s in states if s.epoch == epoch]
    if len(ended) + len(within) < len(states):
        raise ResumeMismatchError(
            f"cannot resume: the states are of epochs {sorted({s.epoch for s in states})}; "
            "an elastic resume continues one interrupted epoch: pass the states the old "
            "workers had reached when the job stopped"
        )
    kinds = {s.remaining for s in within}
    if len(kinds) > 1:
        raise ResumeMismatchError(
            f"cannot resume: the states of epoch {epoch} come from different splits (what "
            "each split divided differs); pass the states of one run's workers"
        )
    runs = _remaining(cache, within[0]) if within else None
    if runs is None:
        runs = ((0, cache.num_elements),) if cache.num_elements else ()
    left: list[tuple[int, int]] = []
    for state in states:
        share = shares.split(runs, state.worker_index, old)
        start = shares.size(share) if state.epoch > epoch else state.start
        if start > shares.size(share):
            raise ResumeMismatchError(
                f"cannot resume: old worker {state.worker_index}'s state has start={start}, "
                f"past the end of its share of epoch {epoch} ({shares.size(share)} elements); "
                "pass the state cc.read_state() gives for the count that worker consumed"
            )
        left.extend(shares.skip(share, start))
    return epoch, shares.merged(left)


def _check_order(cache: Any, options: ReadOptions, state: ReadState) -> None:
    """Refuse a state of another cache, a rebuilt one, another shuffle mode or seed."""
    theirs = (state.cache, state.fingerprint, state.shuffle)
    ours = (cache.name, cache.fingerprint, options.mode)
    for label, a, b in zip(("cache", "fingerprint", "shuffle"), theirs, ours):
        if a != b:
            raise ResumeMismatchError(
                f"cannot resume: the state was saved with {label}={a!r}, this read has "
                f"{label}={b!r}; resume with the options the state was saved under (or "
                "start the epoch afresh without resume=)"
            )
    if options.mode != "none" and options.seed != state.seed:
        raise ResumeMismatchError(
            f"cannot resume: the state was saved with seed={state.seed}, this read has "
            f"seed={options.seed}; the orders differ, so resuming would repeat and skip "
            f"elements: pass seed={state.seed}"
        )


def _remaining(cache: Any, state: ReadState) -> Runs | None:
    if state.remaining is None:
        return None
    return shares.checked(state.remaining, cache.num_elements, "the state's remaining")


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


def share_of(cache: Any, options: ReadOptions, epoch: int) -> Runs:
    """The positions of epoch's order that this worker reads: its share of the epoch, or
    of what an elastic resume left of it (options.remaining, the first epoch only)."""
    if epoch == options.epoch and options.remaining is not None:
        return shares.split(options.remaining, options.worker_index, options.num_workers)
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    return ((lo, hi),) if hi > lo else ()


def check_start(cache: Any, options: ReadOptions) -> None:
    share = shares.size(share_of(cache, options, options.epoch))
    if options.start > share:
        raise InvalidArgumentError(
            f"start={options.start} is past the end of this worker's share of cache "
            f"{cache.name!r} ({share} elements in epoch {options.epoch})"
        )


def cardinality(cache: Any, options: ReadOptions) -> int:
    """What every iteration yields; -2 (unknown) when the first one is resumed mid-epoch."""
    lo, hi = share_range(cache.num_elements, options.worker_index, options.num_workers)
    return -2 if options.start or options.remaining is not None else hi - lo


def epoch_range(
    cache: Any, options: ReadOptions, epoch: int, start: int
) -> tuple[EpochOrder, Runs]:
    """The order of epoch and the runs of positions this worker reads in it, from start."""
    avg = cache.stored_bytes / cache.num_elements if cache.num_elements else 1.0
    block = max(1, int(SHARD_BLOCK_BYTES // max(avg, 1.0)))
    order = EpochOrder(
        options.mode, options.seed or 0, epoch, [s.num_elements for s in cache.shards], block
    )
    return order, shares.skip(share_of(cache, options, epoch), start)
