"""The one opening of a read: every reader opens a READY cache (or a mix of them) here.

cc.dataset(), cc.mix(), cc.cache()'s read epochs, cc.numpy(), cc.torch() and
cc.source() all read through an :class:`OpenRead`, made by :func:`open_read`
(one cache, by name), :func:`open_mix` (a weighted mix) or :func:`opened` (a
cache already looked up, as cc.cache() has it). The sequence is the same for
all, in :func:`opened`: the direct-read decision, the resume (elastic too),
the seed, the start check, and, for one daemon, the direct-read check (a fleet's
members on this host are found per pass). It takes one plan.ReadOptions value;
what comes out holds the resolved options, and opens each pass's chunks
(client/read/assembly/chunks.py) or the cache's records by index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client._daemons import Daemons
from client.format.layout import Layout
from client.read.assembly.buffers import Buffers
from client.read.assembly.chunks import CHUNK_BYTES, CacheReads, EpochChunks, chunk_target
from client.read.assembly.mix_chunks import MixChunks
from client.read.fetching import direct as direct_read
from client.read.planning import mix as mixing
from client.read.planning import plan
from client.read.planning.shares import Batches

#: Moves a read's first epoch and start given its cardinality (a Keras backup's position).
Position = Callable[[int], tuple[int, int] | None]


@dataclass(frozen=True)
class OpenRead:
    """A read opened on a READY cache, or a mix of them: what each pass reads with."""

    daemons: Daemons
    #: pb.Cache, or a mix.Mix (which read/plan.py's functions take as a cache)
    cache: Any
    #: The caches read (one, or the mix's sources, in name order).
    caches: tuple[Any, ...]
    #: The read's options, resumed (resume=None, remaining set), seeded, direct resolved.
    options: plan.ReadOptions
    #: How each cache's passes read directly, by name (client/read/fetching/direct.py).
    direct: dict[str, direct_read.DirectReads]
    #: What every iteration yields; -2 when the first one is resumed mid-epoch (a Keras
    #: position keeps a whole share: Keras keeps its steps an epoch).
    cardinality: int
    #: The large arrays the read decodes into, reused by every pass (read/assembly/buffers.py).
    buffers: Buffers = dataclasses.field(default_factory=Buffers)

    @property
    def layout(self) -> Layout:
        return Layout.from_json(self.caches[0].layout_json)

    def epochs(self) -> plan.Epochs:
        """Which epoch each iteration of one dataset reads, from the options' epoch on."""
        return plan.Epochs(self.options)

    def chunks(
        self, epoch: int, start: int, batches: Batches | None = None
    ) -> EpochChunks | MixChunks:
        """epoch's share, from position start, as numbered chunks; batches: the chunks are
        the consumer's batches (read/assembly/chunks.py)."""
        options = self.options
        if isinstance(self.cache, mixing.Mix):

            def open_source(s: int) -> CacheReads:
                return self._reads(self.cache.sources[s], chunk_target(options.prefetch_bytes))

            return MixChunks(
                self.cache,
                options,
                epoch,
                start,
                chunk_target(options.prefetch_bytes),
                open_source,
                batches,
            )
        return EpochChunks(
            self.daemons.home(self.cache.name),
            self.cache,
            self.layout,
            options,
            epoch,
            start,
            options.prefetch_bytes,
            self.direct[self.cache.name],
            self.daemons.fleet,
            batches,
            self.buffers,
        )

    def records(self, chunk_bytes: int = CHUNK_BYTES) -> CacheReads:
        """The cache's records by index, decoded: random access (cc.source())."""
        return self._reads(self.cache, chunk_bytes)

    def _reads(self, cache: Any, chunk_bytes: int) -> CacheReads:
        return CacheReads(
            self.daemons.home(cache.name),
            cache,
            Layout.from_json(cache.layout_json),
            self.options,
            chunk_bytes,
            True,
            self.direct[cache.name],
            self.daemons.fleet,
            buffers=self.buffers,
        )


def open_read(
    daemons: Daemons,
    local_data_dir: Path | None,
    name: str,
    options: plan.ReadOptions,
    then: str,
    position: Position | None = None,
) -> OpenRead:
    """A read of READY cache name (then: what to do once a WRITING one is READY)."""
    cache = daemons.ready(name, then)
    return opened(daemons, local_data_dir, cache, (cache,), options, position)


def open_mix(
    daemons: Daemons,
    local_data_dir: Path | None,
    weights: Mapping[str, Any],
    size: int | None,
    options: plan.ReadOptions,
) -> OpenRead:
    """A read of a weighted mix of READY caches (client/read/planning/mix.py); options.seed set."""
    caches = tuple(
        daemons.ready(name, "call mix() again", of=" of the mix") for name in sorted(weights)
    )
    seed = options.seed or 0
    mixing.check_seed(seed, options.resume)
    return opened(
        daemons, local_data_dir, mixing.plan(caches, weights, size, seed), caches, options
    )


def opened(
    daemons: Daemons,
    local_data_dir: Path | None,
    cache: Any,
    caches: tuple[Any, ...],
    options: plan.ReadOptions,
    position: Position | None = None,
    direct: dict[str, direct_read.DirectReads] | None = None,
    buffers: Buffers | None = None,
) -> OpenRead:
    """The read of cache (READY, or a mix of READY caches), options applied: the sequence
    every reader's opening runs. direct: the direct-read decision already taken (a
    cc.cache() dataset's, one per dataset); buffers: the arrays an earlier opening of the
    same dataset decoded into (cc.cache() opens each read epoch afresh), else new ones."""
    if direct is None:
        options, direct = direct_reads(daemons, local_data_dir, [c.name for c in caches], options)
    options = dataclasses.replace(
        plan.apply_resume(cache, options, options.resume), resume=None
    ).with_seed()
    cardinality = plan.cardinality(cache, options)
    if position is not None and (at := position(cardinality)) is not None:
        options = dataclasses.replace(options, epoch=at[0], start=at[1])
    plan.check_start(cache, options)
    if daemons.fleet is None:  # a fleet's members on this host are found per pass
        for c in caches:
            direct[c.name].check(c)
    return OpenRead(daemons, cache, caches, options, direct, cardinality, buffers or Buffers())


def direct_reads(
    daemons: Daemons, local_data_dir: Path | None, names: list[str], options: plan.ReadOptions
) -> tuple[plan.ReadOptions, dict[str, direct_read.DirectReads]]:
    """The direct-read decision: (options with direct resolved, how each cache's passes
    read directly, by name). cc.cache() takes it for a cache it is yet to write, too."""
    mode = direct_read.resolve_mode(options.direct)
    return dataclasses.replace(options, direct=mode), {
        name: direct_read.DirectReads(daemons.home(name), mode, local_data_dir) for name in names
    }
