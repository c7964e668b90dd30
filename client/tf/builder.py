"""DatasetBuilder: the datasets cc.dataset() and cc.cache() return, over a client's caches."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import tensorflow as tf

from client._daemons import Daemons
from client._transport import pb
from client.errors import (
    CacheNotFoundError,
    CacheNotReadyError,
    FingerprintMismatchError,
    InvalidArgumentError,
    ServerUnavailableError,
    StoreUnavailableError,
)
from client.format.blocks import blocked, write_batch_elements
from client.format.layout import Layout
from client.observe.report import ReadFigures, Reports
from client.read.assembly.chunks import EpochChunks
from client.read.assembly.mix_chunks import MixChunks
from client.read.opening import OpenRead, direct_reads, open_mix, open_read, opened
from client.read.planning import plan
from client.read.planning.shares import Batches
from client.tf import convert, graphs, malloc, tap
from client.tf import fit as keras_fit
from client.tf import reads as tf_reads
from client.tf.flat_arrays import FlatArrays
from client.tf.iterations import Iterations, generated
from client.write import direct as direct_write
from client.write.stream import CacheWriter
from client.write.write_behind import WriteBehind

log = logging.getLogger("client")
#: What CacheClient's dataset methods return.
Dataset: TypeAlias = tf.data.Dataset


@dataclass
class _Committed:
    """What a cc.cache() dataset's iterations share: its write's begin, its options and
    direct reads, and the read of the committed cache once an iteration has found it."""

    begin: pb.WriteBegin = dataclasses.field(default_factory=pb.WriteBegin)
    options: plan.ReadOptions = dataclasses.field(default_factory=plan.ReadOptions)
    direct: Any = None  # client/read/fetching/direct.py's DirectReads
    read: OpenRead | None = None


class DatasetBuilder:
    """Builds a CacheClient's datasets; the options come checked (client/read/planning/plan.py)."""

    def __init__(
        self,
        daemons: Daemons,
        local_data_dir: Path | None,
        tune_malloc: bool,
        reports: Reports | None = None,
    ) -> None:
        self._daemons = daemons
        self._reports = reports  # the reads' figures for the daemon (client/observe/report.py)
        self._local_data_dir = local_data_dir
        self._tune_malloc = tune_malloc

    def _figures(self, name: str) -> ReadFigures | None:
        return self._reports.reader(name) if self._reports is not None else None

    def dataset(
        self, name: str, options: plan.ReadOptions, resume_from: Any | None = None
    ) -> Dataset:
        """cc.dataset(): a dataset over an existing READY cache; resume_from: a Keras
        backup_dir whose position the first epoch starts at (client/tf/fit.py)."""
        position = (
            None
            if resume_from is None
            else functools.partial(keras_fit.resume_at, resume_from, options.batch_size)
        )
        read = open_read(
            self._daemons, self._local_data_dir, name, options, "call dataset() again", position
        )
        fmt = convert.BatchFormat(convert.decode_spec(read.cache.element_spec), read.layout)
        reader = tf_reads.Reader(
            FlatArrays(fmt),
            functools.partial(self._chunks, read),
            read.epochs(),
            read.options.parallel_shards,
            self._figures(name),
        )
        return tf_reads.elements(fmt, reader.dataset, read.cardinality)

    def mix(self, weights: dict[str, Any], size: int | None, options: plan.ReadOptions) -> Dataset:
        """cc.mix(): a dataset over a weighted mix of READY caches (client/read/planning/mix.py)."""
        read = open_mix(self._daemons, self._local_data_dir, weights, size, options)
        fmt = _mixed_format(read.caches)
        reader = tf_reads.Reader(
            FlatArrays(fmt),
            functools.partial(self._chunks, read),
            read.epochs(),
            read.options.parallel_shards,
        )
        return tf_reads.elements(fmt, reader.dataset, read.cardinality)

    def _chunks(
        self, read: OpenRead | _Committed, epoch: int, start: int, batches: Batches | None
    ) -> EpochChunks | MixChunks:
        """epoch of read from position start of this share, in chunks (read/assembly/chunks.py),
        each a batch of the consumer's when batches are given; read: a cc.cache() dataset's
        committed read (a restored read epoch looks it up)."""
        if isinstance(read, _Committed):
            read = self._committed(read)
        if self._tune_malloc:
            malloc.tune()
        return read.chunks(epoch, start, batches)

    def cache(
        self,
        dataset: Dataset,
        name: str,
        version: str | None,
        options: plan.ReadOptions,
        block_bytes: int,
    ) -> Dataset:
        """cc.cache(): dataset's elements, written through to cache name on the first full
        iteration, read from it once committed."""
        spec = dataset.element_spec
        layout = blocked(convert.layout_of(spec), block_bytes)
        fmt = convert.BatchFormat(spec, layout)
        fingerprint = graphs.fingerprint_of(dataset, version)
        cardinality = source_count = convert.cardinality_of(dataset)
        if cardinality == convert.INFINITE:
            raise InvalidArgumentError(
                f"cannot cache {name!r}: the dataset is infinite; call cc.cache() before .repeat()"
            )
        try:
            existing = self._daemons.get(name)
        except (CacheNotFoundError, StoreUnavailableError):  # the daemon builds it, unless
            existing = None  # its WriteBegin finds it in the store (docs/operations.md)
        ready = existing is not None and existing.state == pb.CACHE_STATE_READY
        if options.resume is not None and not ready:
            raise (CacheNotFoundError if existing is None else CacheNotReadyError)(
                f"cannot resume reading cache {name!r}: it is not READY on this daemon, so "
                "there is no epoch to continue; iterate cc.cache() without resume= (its "
                "first iteration writes the cache)"
            )
        if existing is not None:
            _check_same_source(existing, fingerprint, layout)
        committed = _Committed()
        if ready:
            committed.read = opened(
                self._daemons, self._local_data_dir, existing, (existing,), options
            )
            options, direct = committed.read.options, committed.read.direct[name]
            cardinality = committed.read.cardinality
        else:
            options, by_name = direct_reads(self._daemons, self._local_data_dir, [name], options)
            options, direct = options.with_seed(), by_name[name]
            if not options.whole_epochs:
                cardinality = -2  # a writing iteration yields all, reading ones a share
        begin = pb.WriteBegin(
            name=name,
            fingerprint=fingerprint,
            layout_json=layout.to_json(),
            element_spec=convert.encode_spec(spec),
        )
        committed.begin, committed.options, committed.direct = begin, options, direct
        epochs = plan.Epochs(options)
        reader = tf_reads.Reader(
            FlatArrays(fmt),
            functools.partial(self._chunks, committed),
            epochs,
            options.parallel_shards,
            self._figures(name),
        )
        iterations = Iterations(reader, epochs, dataset.options())
        if self._tune_malloc:
            iterations.source_started = malloc.tune
        decide = iterations.deciding(functools.partial(self._begin_epoch, committed))
        if source_count >= 0 and tap.enabled():  # the source stays in tf.data
            taps = tap.TapEpochs(layout, decide, source_count, reader.flat.batch)

            def tapped(source: Dataset, cardinality: int) -> Dataset:
                return tf_reads.elements(
                    fmt,
                    lambda per_iteration: convert.tapped_batches(
                        source,
                        fmt,
                        taps,
                        iterations,
                        write_batch_elements(layout),
                        batched_reads=False,
                        per_iteration=per_iteration,
                    ),
                    cardinality,
                    functools.partial(convert.tapped_batches, source, fmt, taps, iterations),
                    lambda log_warning: tapped(source.ignore_errors(log_warning), -2),
                )

            return tapped(dataset, cardinality)
        return tf_reads.elements(
            fmt,
            functools.partial(
                generated,
                iterations,
                decide,
                lambda decision: self._write_through(dataset, fmt, decision.writer),
                fmt.signature,
            ),
            cardinality,
        )

    def _committed(self, committed: _Committed, cache: pb.Cache | None = None) -> OpenRead:
        """The read of the committed cache a cc.cache() dataset reads: cache (just found
        READY), else the one known, else looked up (a read epoch restored from a
        checkpoint)."""
        begin = committed.begin
        if cache is None and committed.read is not None:
            return committed.read
        if cache is None:
            cache = self._daemons.get(begin.name)
            if cache.state != pb.CACHE_STATE_READY:
                raise CacheNotReadyError(
                    f"a checkpoint restores a read epoch of cache {begin.name!r}, which is not "
                    "READY on this daemon: restore on the daemon that holds the cache, or "
                    "build it again first (one full pass over cc.cache())"
                )
            _check_same_source(cache, begin.fingerprint, Layout.from_json(begin.layout_json))
        committed.read = opened(
            self._daemons,
            self._local_data_dir,
            cache,
            (cache,),
            committed.options,
            direct={cache.name: committed.direct},
            # every read epoch decodes into the same maps: a fresh map's pages are zeroed
            # as they are first written (client/read/assembly/buffers.py)
            buffers=None if committed.read is None else committed.read.buffers,
        )
        return committed.read

    def _begin_epoch(self, committed: _Committed) -> tap.Decision:
        """What an iteration of a cc.cache() dataset does: read, write through, or pass through.

        A READ iteration reads the epoch its control took (client/tf/iterations.py)."""
        if self._tune_malloc:  # from_generator has applied its own setting by now
            malloc.tune()
        begin = committed.begin
        writer = direct_write.writer_for(
            self._daemons.home(begin.name), begin, committed.direct, self._local_data_dir
        )
        try:
            begun = writer.begin()  # docs/writing.md
        except ServerUnavailableError as exc:
            writer.abort()
            log.warning("%s; this epoch runs the source pipeline without the cache", exc)
            return tap.Decision(tap.SOURCE)
        if begun.decision == pb.WRITE_DECISION_ACCEPTED:
            return tap.Decision(tap.WRITE, writer=writer)
        writer.abort()  # ends the stream's request thread
        if begun.decision == pb.WRITE_DECISION_ALREADY_READY:
            self._committed(committed, begun.cache)  # checks the start against it
            return tap.Decision(tap.READ)
        log.info(
            "cache %r is being written by another process; streaming the source "
            "pipeline without writing",
            begin.name,
        )
        return tap.Decision(tap.SOURCE)

    def _write_through(
        self, dataset: Dataset, fmt: convert.BatchFormat, writer: CacheWriter | None
    ) -> Iterator[Any]:
        """Yield the source's batches, sending them to writer (None: just yield)."""
        layout = fmt.layout
        behind = WriteBehind(writer, layout) if writer is not None else None
        seen, whole = 0, convert.cardinality_of(dataset)
        try:
            for n, batch in convert.source_batches(dataset, fmt, write_batch_elements(layout)):
                if behind is not None:
                    behind.put(n, batch)  # encoded and sent while the source runs on
                    seen += n
                    if seen == whole:  # a declared cardinality stops at the last element
                        tap.committed(behind)
                yield fmt.to_wire(batch, n)
            if behind is not None and (whole < 0 or whole == seen == 0):
                tap.committed(behind)
        finally:
            if behind is not None:
                behind.close()


def _mixed_format(caches: tuple[pb.Cache, ...]) -> convert.BatchFormat:
    """The one element format of a mix's caches; refuses caches whose elements differ."""
    first, spec = caches[0], convert.decode_spec(caches[0].element_spec)
    leaves = Layout.from_json(first.layout_json).leaves
    for cache in caches[1:]:
        other = convert.decode_spec(cache.element_spec)
        if other != spec or Layout.from_json(cache.layout_json).leaves != leaves:
            raise InvalidArgumentError(
                f"cannot mix caches {first.name!r} and {cache.name!r}: their elements differ "
                f"({first.name!r}: {spec}; {cache.name!r}: {other}); mix caches of one "
                "element spec, or map them to one before caching"
            )
    return convert.BatchFormat(spec, Layout.from_json(first.layout_json))


def _check_same_source(cache: pb.Cache, fingerprint: str, layout: Layout) -> None:
    # leaves, not block_elements: a cache of format 1 (or other blocks) is read as it is
    if cache.fingerprint != fingerprint or (
        Layout.from_json(cache.layout_json).leaves != layout.leaves
    ):
        raise FingerprintMismatchError(
            f"cache {cache.name!r} holds elements of a different pipeline (fingerprint "
            f"{cache.fingerprint}, this pipeline {fingerprint}); delete it with "
            f"`cacheserver rm {cache.name}` or CacheClient.delete({cache.name!r}) to rebuild "
            "it, or use another name or version="
        )
