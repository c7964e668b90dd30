"""DatasetBuilder: the datasets cc.dataset() and cc.cache() return, over a catalog's caches."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import tensorflow as tf

from client._catalog import Catalog
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
from client.read import direct as direct_read
from client.read import mix as mixing
from client.read import plan
from client.read.chunks import CacheReads, EpochChunks, chunk_target
from client.read.mix_chunks import MixChunks
from client.read.report import ReadFigures, Reports
from client.tf import convert, graphs, malloc, tap
from client.tf import fit as keras_fit
from client.tf import reads as tf_reads
from client.tf.flat_arrays import Wire
from client.tf.iterations import Iterations, generated
from client.write import direct as direct_write
from client.write.stream import CacheWriter
from client.write.write_behind import WriteBehind

log = logging.getLogger("client")
#: What CacheClient's dataset methods return.
Dataset: TypeAlias = tf.data.Dataset


@dataclass
class _Committed:
    """The committed cache a cc.cache() dataset reads, once an iteration has found it."""

    cache: pb.Cache | None = None


class DatasetBuilder:
    """Builds a CacheClient's datasets; the arguments come checked (client/_client.py)."""

    def __init__(self, catalog: Catalog, local_data_dir: Path | None, tune_malloc: bool,
                 reports: Reports | None = None) -> None:
        self._catalog = catalog
        self._reports = reports  # the reads' figures for the daemon (client/read/report.py)
        self._local_data_dir = local_data_dir
        self._tune_malloc = tune_malloc

    def _figures(self, name: str) -> ReadFigures | None:
        return self._reports.reader(name) if self._reports is not None else None

    def _direct(self, name: str, mode: direct_read.Mode) -> direct_read.DirectReads:
        return direct_read.DirectReads(self._catalog.home(name), mode, self._local_data_dir)

    def dataset(self, name: str, options: plan.ReadOptions, resume: plan.Resume,
                prefetch_bytes: int, direct: direct_read.Mode,
                fit: tuple[Any, Any] | None = None) -> Dataset:
        """cc.dataset(): a dataset over an existing READY cache; fit: (backup_dir,
        batch_size) of resume_from= (client/tf/fit.py)."""
        reads = self._direct(name, direct)
        cache = self._catalog.ready(name, "call dataset() again")
        fmt = convert.BatchFormat(convert.decode_spec(cache.element_spec),
                                  Layout.from_json(cache.layout_json))
        options = plan.apply_resume(cache, options, resume).with_seed()
        cardinality = plan.cardinality(cache, options)
        if fit is not None and (at := keras_fit.resume_at(*fit, cardinality)) is not None:
            # every epoch declares a whole share: Keras keeps its steps an epoch
            options = dataclasses.replace(options, epoch=at[0], start=at[1])
        plan.check_start(cache, options)
        if self._catalog.fleet is None:  # a fleet's members on this host are found per pass
            reads.check(cache)
        reader = tf_reads.Reader(Wire(fmt), functools.partial(
            self._epoch_chunks, cache, fmt.layout, options, prefetch_bytes, reads),
            plan.Epochs(options), options.parallel_shards, self._figures(name))
        return tf_reads.elements(fmt, reader.dataset, cardinality)

    def mix(self, weights: dict[str, Any], size: int | None, options: plan.ReadOptions,
            resume: plan.Resume, prefetch_bytes: int, direct: direct_read.Mode) -> Dataset:
        """cc.mix(): a dataset over a weighted mix of READY caches (client/read/mix.py)."""
        caches = [self._catalog.ready(name, "call mix() again", of=" of the mix")
                  for name in sorted(weights)]
        fmt = _mixed_format(caches)
        mix = mixing.plan(caches, weights, size, options.seed or 0)
        mixing.check_seed(options.seed or 0, resume)
        options = plan.apply_resume(mix, options, resume)
        plan.check_start(mix, options)
        reads = {c.name: self._direct(c.name, direct) for c in caches}
        if self._catalog.fleet is None:
            for cache in caches:
                reads[cache.name].check(cache)

        def open_chunks(epoch: int, start: int) -> MixChunks:
            if self._tune_malloc:
                malloc.tune()
            chunk_bytes = chunk_target(prefetch_bytes)

            def open_source(s: int) -> CacheReads:
                cache = mix.sources[s]
                return CacheReads(self._catalog.home(cache.name), cache, fmt.layout, options,
                                  chunk_bytes, True, reads[cache.name], self._catalog.fleet)
            return MixChunks(mix, options, epoch, start, chunk_bytes, open_source)

        reader = tf_reads.Reader(Wire(fmt), open_chunks, plan.Epochs(options),
                                 options.parallel_shards)
        return tf_reads.elements(fmt, reader.dataset, plan.cardinality(mix, options))

    def cache(self, dataset: Dataset, name: str, version: str | None,
              options: plan.ReadOptions, resume: plan.Resume, prefetch_bytes: int,
              direct: direct_read.Mode, block_bytes: int) -> Dataset:
        """cc.cache(): dataset's elements, written through to cache name on the first full
        iteration, read from it once committed."""
        reads = self._direct(name, direct)
        spec = dataset.element_spec
        layout = blocked(convert.layout_of(spec), block_bytes)
        fmt = convert.BatchFormat(spec, layout)
        fingerprint = graphs.fingerprint_of(dataset, version)
        cardinality = source_count = convert.cardinality_of(dataset)
        if cardinality == convert.INFINITE:
            raise InvalidArgumentError(
                f"cannot cache {name!r}: the dataset is infinite; call cc.cache() before "
                ".repeat()")
        try:
            existing = self._catalog.get(name)
        except (CacheNotFoundError, StoreUnavailableError):  # the daemon builds it, unless
            existing = None  # its WriteBegin finds it in the store (docs/operations.md)
        if resume is not None and (existing is None
                                   or existing.state != pb.CACHE_STATE_READY):
            raise (CacheNotFoundError if existing is None else CacheNotReadyError)(
                f"cannot resume reading cache {name!r}: it is not READY on this daemon, so "
                "there is no epoch to continue; iterate cc.cache() without resume= (its "
                "first iteration writes the cache)")
        if existing is not None:
            _check_same_source(existing, fingerprint, layout)
            options = plan.apply_resume(existing, options, resume)
            if existing.state == pb.CACHE_STATE_READY:
                plan.check_start(existing, options)
                if self._catalog.fleet is None:
                    reads.check(existing)
                cardinality = plan.cardinality(existing, options)
            elif not options.whole_epochs:
                cardinality = -2  # a writing iteration yields all, reading ones a share
        elif not options.whole_epochs:
            cardinality = -2
        begin = pb.WriteBegin(name=name, fingerprint=fingerprint, layout_json=layout.to_json(),
                              element_spec=convert.encode_spec(spec))
        options = options.with_seed()  # after resume=, which checks the seed it was given
        epochs = plan.Epochs(options)
        ready = _Committed(existing if existing is not None
                           and existing.state == pb.CACHE_STATE_READY else None)
        reader = tf_reads.Reader(Wire(fmt), functools.partial(
            self._cache_chunks, ready, begin, options, prefetch_bytes, reads), epochs,
            options.parallel_shards, self._figures(name))
        iterations = Iterations(reader, epochs, dataset.options())
        if self._tune_malloc:
            iterations.source_started = malloc.tune
        decide = iterations.deciding(functools.partial(self._begin_epoch, begin, epochs, reads,
                                                       ready))
        if source_count >= 0 and tap.enabled():  # the source stays in tf.data
            taps = tap.TapEpochs(layout, decide, source_count, reader.wire.batch)

            def tapped(source: Dataset, cardinality: int) -> Dataset:
                return tf_reads.elements(fmt, lambda per_iteration: convert.tapped_batches(
                    source, fmt, taps, iterations, write_batch_elements(layout),
                    rebatch_reads=False, per_iteration=per_iteration), cardinality,
                    functools.partial(convert.tapped_batches, source, fmt, taps, iterations),
                    lambda log_warning: tapped(source.ignore_errors(log_warning), -2))
            return tapped(dataset, cardinality)
        return tf_reads.elements(fmt, functools.partial(
            generated, iterations, decide,
            lambda decision: self._write_through(dataset, fmt, decision.writer),
            fmt.signature), cardinality)

    def _epoch_chunks(self, cache: pb.Cache, layout: Layout, options: plan.ReadOptions,
                      prefetch_bytes: int, direct: direct_read.DirectReads | None,
                      epoch: int, start: int) -> EpochChunks:
        """epoch over cache from position start of this share, in chunks (read/chunks.py)."""
        if self._tune_malloc:
            malloc.tune()
        return EpochChunks(self._catalog.home(cache.name), cache, layout, options, epoch, start,
                           prefetch_bytes, direct, self._catalog.fleet)

    def _cache_chunks(self, ready: _Committed, begin: pb.WriteBegin,
                      options: plan.ReadOptions, prefetch_bytes: int,
                      direct: direct_read.DirectReads, epoch: int, start: int) -> EpochChunks:
        """A read epoch of a cc.cache() dataset, in chunks."""
        return self._epoch_chunks(self._ready(ready, begin), Layout.from_json(
            begin.layout_json), options, prefetch_bytes, direct, epoch, start)

    def _ready(self, ready: _Committed, begin: pb.WriteBegin) -> pb.Cache:
        """The committed cache a cc.cache() dataset reads: ready.cache, when known (a read
        epoch restored from a checkpoint looks it up)."""
        cache = ready.cache
        if cache is None:
            cache = self._catalog.get(begin.name)
            if cache.state != pb.CACHE_STATE_READY:
                raise CacheNotReadyError(
                    f"a checkpoint restores a read epoch of cache {begin.name!r}, which is not "
                    "READY on this daemon: restore on the daemon that holds the cache, or "
                    "build it again first (one full pass over cc.cache())")
            _check_same_source(cache, begin.fingerprint, Layout.from_json(begin.layout_json))
            ready.cache = cache
        return cache

    def _begin_epoch(self, begin: pb.WriteBegin, epochs: plan.Epochs,
                     direct: direct_read.DirectReads, ready: _Committed) -> tap.Decision:
        """What an iteration of a cc.cache() dataset does: read, write through, or pass through.

        A READ iteration reads the epoch its control took (client/tf/iterations.py)."""
        if self._tune_malloc:  # from_generator has applied its own setting by now
            malloc.tune()
        writer = direct_write.writer_for(self._catalog.home(begin.name), begin, direct,
                                          self._local_data_dir)  # docs/writing.md
        try:
            begun = writer.begin()
        except ServerUnavailableError as exc:
            writer.abort()
            log.warning("%s; this epoch runs the source pipeline without the cache", exc)
            return tap.Decision(tap.SOURCE)
        if begun.decision == pb.WRITE_DECISION_ACCEPTED:
            return tap.Decision(tap.WRITE, writer=writer)
        writer.abort()  # ends the stream's request thread
        if begun.decision == pb.WRITE_DECISION_ALREADY_READY:
            plan.check_start(begun.cache, epochs.options)
            ready.cache = begun.cache
            return tap.Decision(tap.READ)
        log.info("cache %r is being written by another process; streaming the source "
                 "pipeline without writing", begin.name)
        return tap.Decision(tap.SOURCE)

    def _write_through(self, dataset: Dataset, fmt: convert.BatchFormat,
                       writer: CacheWriter | None) -> Iterator[Any]:
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


def _mixed_format(caches: list[pb.Cache]) -> convert.BatchFormat:
    """The one element format of a mix's caches; refuses caches whose elements differ."""
    first, spec = caches[0], convert.decode_spec(caches[0].element_spec)
    leaves = Layout.from_json(first.layout_json).leaves
    for cache in caches[1:]:
        other = convert.decode_spec(cache.element_spec)
        if other != spec or Layout.from_json(cache.layout_json).leaves != leaves:
            raise InvalidArgumentError(
                f"cannot mix caches {first.name!r} and {cache.name!r}: their elements differ "
                f"({first.name!r}: {spec}; {cache.name!r}: {other}); mix caches of one "
                "element spec, or map them to one before caching")
    return convert.BatchFormat(spec, Layout.from_json(first.layout_json))


def _check_same_source(cache: pb.Cache, fingerprint: str, layout: Layout) -> None:
    # leaves, not block_elements: a cache of format 1 (or other blocks) is read as it is
    if cache.fingerprint != fingerprint or (
            Layout.from_json(cache.layout_json).leaves != layout.leaves):
        raise FingerprintMismatchError(
            f"cache {cache.name!r} holds elements of a different pipeline (fingerprint "
            f"{cache.fingerprint}, this pipeline {fingerprint}); delete it with "
            f"`cacheserver rm {cache.name}` or CacheClient.delete({cache.name!r}) to rebuild "
            "it, or use another name or version=")
