"""CacheClient: the public entry point of the client library."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client import _materialize
from client._fleet import TARGETS_ENV, Fleet, parse_targets
from client._materialize import MaterializeOperation
from client._transport import Credentials, Pem, Transport, pb, resolve_target
from client.errors import (
    CacheNotFoundError,
    CacheNotReadyError,
    FingerprintMismatchError,
    InvalidArgumentError,
    ServerUnavailableError,
    StoreUnavailableError,
)
from client.format.blocks import blocked, check_block_bytes, write_batch_elements
from client.format.layout import Layout
from client.read import direct as direct_read
from client.read import plan
from client.read.chunks import EpochChunks
from client.read.streams import DEFAULT_PREFETCH_BYTES, read_epoch
from client.tf import malloc, tap
from client.write import direct as direct_write
from client.write.spare_cpu import compress_mode
from client.write.stream import CacheWriter
from client.write.write_behind import WriteBehind

if TYPE_CHECKING:
    import tensorflow as tf

    from client.tf.convert import BatchFormat

log = logging.getLogger("client")
_STATES = {pb.CACHE_STATE_WRITING: "WRITING", pb.CACHE_STATE_READY: "READY"}
@dataclass(frozen=True)
class CacheInfo:
    """What the daemon knows about one cache."""

    name: str
    state: str  # "WRITING" or "READY"
    num_elements: int
    num_shards: int
    disk_bytes: int
    raw_bytes: int
    stored_bytes: int
    fingerprint: str
    create_time: float
    commit_time: float
    pinned: bool = False
    ttl_seconds: float = 0.0  # 0: no TTL
    last_read_time: float = 0.0  # 0: never read
    hits: int = 0  # shard streams opened at a shard's first record
    direct_leases: int = 0  # same-host direct readers now (docs/direct.md)
    direct_reads: int = 0  # direct read passes since the daemon started
    #: Where the cache stands in the daemon's object store (docs/operations.md): "" without
    #: one, else LOCAL, PUBLISHING, STORED, PULLING, CONFLICT, or REMOTE (only in the store).
    store_state: str = ""
    store_done_bytes: int = 0  # of store_total_bytes, uploaded or fetched
    store_total_bytes: int = 0
    store_detail: str = ""  # why it is not stored yet (the last error), or the conflict

    @property
    def compression_ratio(self) -> float:
        """Record bytes before compression / after (1.0 for an empty cache)."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 1.0

    @classmethod
    def from_proto(cls, c: pb.Cache) -> CacheInfo:
        return cls(c.name, _STATES.get(c.state, "UNSPECIFIED"), c.num_elements, len(c.shards),
                   c.disk_bytes, c.raw_bytes, c.stored_bytes, c.fingerprint, c.create_time,
                   c.commit_time, c.pinned, c.ttl_seconds, c.last_read_time, c.hits,
                   c.direct_leases, c.direct_reads,
                   pb.StoreState.Name(c.store.state).removeprefix("STORE_STATE_")
                   if c.store.state else "", c.store.done_bytes, c.store.total_bytes,
                   c.store.detail)


@dataclass
class _Committed:
    """The committed cache a cc.cache() dataset reads, once an iteration has found it."""

    cache: pb.Cache | None = None


def _free_dangling_iterators() -> None:
    """At exit, free tf.data iterators an uncaught exception's traceback still holds.

    A Ctrl-C in the middle of an epoch leaves the iterator alive in
    sys.last_traceback; destroyed during interpreter finalization, when no
    thread can run Python, it waits on its from_generator call to finish and
    the process hangs. atexit handlers still run with threads alive.
    """
    sys.last_type = sys.last_value = sys.last_traceback = None  # type: ignore[assignment]
    if hasattr(sys, "last_exc"):
        sys.last_exc = None  # type: ignore[attr-defined]
    gc.collect()


_exit_hook = functools.cache(lambda: atexit.register(_free_dangling_iterators))


class CacheClient:
    """A connection to one cacheserver daemon, or to a fleet of them.

    target is "host:port" or "unix:///path/to.sock"; when omitted, the
    SHARDCACHE_TARGET environment variable, else 127.0.0.1:50051. Use as a
    context manager, or call close().

    targets (a list, or a comma-separated string; default $SHARDCACHE_TARGETS)
    makes a fleet of daemons over one object store one cache: each shard is read
    from its owner by rendezvous hashing, a member found down hands its shards to
    their next owners mid-epoch, and "dns:///NAME:PORT" stands for every address
    NAME resolves to, looked up again as it changes (a headless Service).
    See docs/fleet.md. Give target or targets, not both.

    tune_malloc (default True) raises glibc's mmap/trim thresholds when an
    epoch starts, undoing the 128 KiB trim threshold TensorFlow's
    from_generator sets, which makes every large buffer page-fault afresh and
    halves read throughput (client/tf/malloc.py has the numbers).

    local_data_dir is where the daemon's data dir is mounted in this process's
    filesystem when not at the daemon's own path (a sidecar's volume mounted
    elsewhere; default: $SHARDCACHE_LOCAL_DATA_DIR): direct reads (docs/direct.md).

    token is the daemon's bearer token (default: $CACHESERVER_TOKEN). tls_ca
    (a CA to trust), tls_cert and tls_key (a client certificate, for mutual
    TLS) are PEM file paths or PEM bytes; any of them turns TLS on.
    """

    def __init__(self, target: str | None = None, *, targets: str | Sequence[str] | None = None,
                 connect_timeout: float = 5.0,
                 tune_malloc: bool = True, token: str | None = None, tls_ca: Pem | None = None,
                 tls_cert: Pem | None = None, tls_key: Pem | None = None,
                 local_data_dir: str | Path | None = None) -> None:
        credentials = Credentials.make(token, tls_ca, tls_cert, tls_key)
        if target is not None and targets is not None:
            raise InvalidArgumentError("give target (one daemon) or targets (a fleet), not both")
        if targets is None and target is None:
            targets = os.environ.get(TARGETS_ENV) or None
        self._fleet: Fleet | None = None
        self._transport: Transport | None = None
        if targets is not None:
            self._fleet = Fleet(parse_targets(targets), connect_timeout, credentials)
            self.target = repr(self._fleet)
        else:
            self.target = resolve_target(target)
            self._transport = Transport(self.target, connect_timeout, credentials=credentials)
        self._tune_malloc = malloc.enabled(tune_malloc)
        self._local_data_dir = direct_read.resolve_local_data_dir(local_data_dir)
        _exit_hook()

    def __enter__(self) -> CacheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fleet is not None:
            self._fleet.close()
        if self._transport is not None:
            self._transport.close()

    def __repr__(self) -> str:
        return f"CacheClient({self.target!r})"

    # ------------------------------------------------------------------ catalog

    def _home(self, name: str) -> Transport:
        """The daemon that answers for cache name: the one daemon, or the name's home
        member in a fleet (client/_fleet.py)."""
        if self._fleet is None:
            assert self._transport is not None
            return self._transport
        return self._fleet.transport(self._fleet.owner(name, -1))

    def _call(self, name: str, method: str, request: Any) -> Any:
        """A unary call to name's daemon; in a fleet, a home found down is marked so
        and the call goes to the next member in the name's order."""
        while True:
            transport = self._home(name)
            try:
                return transport.call(getattr(transport.stub, method), request)
            except ServerUnavailableError as exc:
                if self._fleet is None or all(
                        m == transport.target or self._fleet.is_down(m)
                        for m in self._fleet.members()):
                    raise
                self._fleet.mark_down(transport.target, str(exc))

    def _get(self, name: str) -> pb.Cache:
        return self._call(name, "GetCache", pb.GetCacheRequest(name=name)).cache

    def list(self, *, store: bool = False) -> list[CacheInfo]:
        """Every cache on the daemon, READY and WRITING; store=True: every cache in the
        daemon's object store instead (store_state REMOTE, or this daemon's own state)."""
        response = self._call("", "ListCaches", pb.ListCachesRequest(store=store))
        return [CacheInfo.from_proto(c) for c in response.caches]

    def info(self, name: str) -> CacheInfo:
        """One cache; raises CacheNotFoundError when it does not exist."""
        return CacheInfo.from_proto(self._get(name))

    def delete(self, name: str, *, store: bool = False) -> tuple[bool, bool]:
        """Delete a READY cache and its files on the daemon; store=True: also its copy in
        the daemon's object store, so no daemon finds it any more. Returns what was
        removed: (the daemon's copy, the stored copy)."""
        response = self._call(name, "DeleteCache", pb.DeleteCacheRequest(name=name, store=store))
        return response.local, response.stored

    def pin(self, name: str) -> CacheInfo:
        """Keep a READY cache however full the disk gets and whatever its TTL."""
        return self._retention(name, pinned=True)

    def unpin(self, name: str) -> CacheInfo:
        """Let the daemon evict the cache again (least recently read first)."""
        return self._retention(name, pinned=False)

    def set_ttl(self, name: str, seconds: float | None) -> CacheInfo:
        """Delete the cache once unread for this many seconds; None clears the TTL."""
        if seconds is not None and not seconds > 0:
            raise InvalidArgumentError(f"ttl must be a positive number of seconds or None, "
                                       f"got {seconds!r}")
        return self._retention(name, ttl_seconds=seconds or 0.0)

    def _retention(self, name: str, **fields: Any) -> CacheInfo:
        request = pb.SetCacheRetentionRequest(name=name, **fields)
        return CacheInfo.from_proto(self._call(name, "SetCacheRetention", request).cache)

    # ------------------------------------------------------------------ datasets

    def dataset(self, name: str, *, prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
                shuffle: bool | str = False, seed: int | None = None, worker_index: int = 0,
                num_workers: int = 1, parallel_shards: int = 0, epoch: int = 0, start: int = 0,
                resume: plan.ReadState | None = None,
                reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
                direct: bool | str | None = None, checkpoint: bool = False
                ) -> tf.data.Dataset:
        """A tf.data.Dataset over an existing READY cache; needs no source pipeline.

        shuffle=True visits every element once per epoch in an order over the
        whole cache, new each epoch, fixed by (seed, epoch); shuffle="shards"
        shuffles shards and ~1 MiB blocks within them (sequential disk reads).
        Worker worker_index of num_workers reads its disjoint share of each
        epoch. parallel_shards chunks are read at once by tf.data's threads (0:
        tf.data's AUTOTUNE picks); the order stays deterministic. epoch/start
        (or resume=, see read_state()) begin at position start of epoch's share;
        each further iteration reads the next epoch. A daemon lost mid-epoch is
        reconnected to for up to reconnect_timeout seconds, continuing at the
        next undelivered element.
        See docs/reading.md.

        direct: "auto" reads the shard files themselves when this process
        runs on the daemon's host and sees its data dir (else over gRPC, logged
        once at INFO); True insists (DirectReadUnavailableError says why not);
        False always streams over gRPC. None: $SHARDCACHE_DIRECT, else "auto".
        See docs/direct.md.

        checkpoint=True: tf.train.Checkpoint(iterator=it) can save this dataset's
        iterators and restore them in any process (docs/reading.md, "Checkpoints");
        it costs ~5-20% of the read's speed, so it is off by default.
        """
        from client.tf import convert
        from client.tf import reads as tf_reads

        _check_prefetch(prefetch_bytes)
        _check_checkpoint(checkpoint)
        reads = direct_read.DirectReads(self._home(name), direct_read.resolve_mode(direct),
                                        self._local_data_dir)
        options = plan.ReadOptions(shuffle, seed, worker_index, num_workers, parallel_shards,
                                    epoch, start, reconnect_timeout)
        cache = self._get(name)
        if cache.state != pb.CACHE_STATE_READY:
            raise CacheNotReadyError(
                f"cache {name!r} is WRITING ({cache.num_elements} elements committed so far); "
                "wait until its writer finishes, then call dataset() again")
        fmt = convert.BatchFormat(convert.decode_spec(cache.element_spec),
                              Layout.from_json(cache.layout_json))
        options = plan.apply_resume(cache, options, resume).with_seed()
        plan.check_start(cache, options)
        if self._fleet is None:  # a fleet's members on this host are found per pass
            reads.check(cache)
        reader = tf_reads.Reader(tf_reads.Wire(fmt), functools.partial(
            self._epoch_batches, cache, fmt.layout, options, prefetch_bytes, reads),
            plan.Epochs(options), checkpoint, functools.partial(
                self._epoch_chunks, cache, fmt.layout, options, prefetch_bytes, reads),
            options.parallel_shards)
        return tf_reads.elements(fmt, reader.dataset, plan.cardinality(cache, options),
                                 checkpoint)

    def cache(self, dataset: tf.data.Dataset, name: str, *, version: str | None = None,
              prefetch_bytes: int = DEFAULT_PREFETCH_BYTES, shuffle: bool | str = False,
              seed: int | None = None, worker_index: int = 0, num_workers: int = 1,
              parallel_shards: int = 0, epoch: int = 0, start: int = 0,
              reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
              direct: bool | str | None = None, block_bytes: int | None = None,
              checkpoint: bool = False) -> tf.data.Dataset:
        """The drop-in for ``dataset.cache()``, stored by the daemon under name.

        The first full iteration runs dataset and writes its elements through to
        the daemon while yielding them; once committed, iterations stream from
        the daemon. An iteration stopped early writes nothing. The cache is keyed
        by a fingerprint of the pipeline (or version, when given): a changed
        pipeline raises FingerprintMismatchError instead of serving old elements.

        The read options are cc.dataset()'s. They apply to iterations that read
        the cache; an iteration that writes it yields the whole source in source
        order (see docs/reading.md); direct and checkpoint are cc.dataset()'s too (an
        iteration that writes cannot be saved).

        block_bytes: raw bytes per stored block of small fixed-shape elements
        (default $SHARDCACHE_BLOCK_BYTES, else 256 KiB); 0 stores one element per
        value, cheaper for caches read mostly with shuffle=True (docs/format.md, "Blocks").
        $SHARDCACHE_COMPRESS=spare-cpu compresses a write epoch's records only
        while the process has CPU to spare (docs/writing.md).
        """
        from client.tf import convert, graphs
        from client.tf import reads as tf_reads

        _check_prefetch(prefetch_bytes)
        _check_checkpoint(checkpoint)
        reads = direct_read.DirectReads(self._home(name), direct_read.resolve_mode(direct),
                                        self._local_data_dir)
        options = plan.ReadOptions(shuffle, seed, worker_index, num_workers, parallel_shards,
                                    epoch, start, reconnect_timeout).with_seed()
        block_bytes = check_block_bytes(block_bytes)
        compress_mode()  # a bad $SHARDCACHE_COMPRESS fails here, not in the write epoch
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
            existing = self._get(name)
        except (CacheNotFoundError, StoreUnavailableError):  # the daemon builds it, unless
            existing = None  # its WriteBegin finds it in the store (docs/operations.md)
        if existing is not None:
            _check_same_source(existing, fingerprint, layout)
            if existing.state == pb.CACHE_STATE_READY:
                plan.check_start(existing, options)
                if self._fleet is None:
                    reads.check(existing)
                cardinality = plan.cardinality(existing, options)
            elif not options.whole_epochs:
                cardinality = -2  # a writing iteration yields all, reading ones a share
        elif not options.whole_epochs:
            cardinality = -2
        begin = pb.WriteBegin(name=name, fingerprint=fingerprint, layout_json=layout.to_json(),
                              element_spec=convert.encode_spec(spec))
        epochs = plan.Epochs(options)
        ready = _Committed(existing if existing is not None
                           and existing.state == pb.CACHE_STATE_READY else None)
        reader = tf_reads.Reader(tf_reads.Wire(fmt), functools.partial(
            self._cache_batches, ready, begin, options, prefetch_bytes, reads), epochs,
            checkpoint, functools.partial(self._cache_chunks, ready, begin, options,
                                          prefetch_bytes, reads), options.parallel_shards)
        iterations = tf_reads.Iterations(reader, epochs, dataset.options())
        if self._tune_malloc:
            iterations.source_started = malloc.tune
        decide = iterations.deciding(functools.partial(self._begin_epoch, begin, epochs, reads,
                                                       ready))
        if source_count >= 0 and tap.enabled():  # the source stays in tf.data
            taps = tap.TapEpochs(layout, decide, source_count, reader.wire.batch)

            def tapped(source: tf.data.Dataset, cardinality: int) -> tf.data.Dataset:
                return tf_reads.elements(fmt, lambda per_iteration: convert.tapped_batches(
                    source, fmt, taps, iterations, write_batch_elements(layout),
                    rebatch_reads=False, per_iteration=per_iteration), cardinality, checkpoint,
                    functools.partial(convert.tapped_batches, source, fmt, taps, iterations),
                    lambda log_warning: tapped(source.ignore_errors(log_warning), -2))
            return tapped(dataset, cardinality)
        return tf_reads.elements(fmt, functools.partial(
            tf_reads.generated, iterations, decide,
            lambda decision: self._write_through(dataset, fmt, decision.writer),
            fmt.signature), cardinality, checkpoint)

    def materialize(self, source: str | tf.data.Dataset, name: str, *, num_shards: int,
                    workers: int | None = None, overwrite: bool = False, wait: bool = True,
                    resume: bool = False, block_bytes: int | None = None
                    ) -> CacheInfo | MaterializeOperation:
        """Have the daemon run a pipeline itself and store it as cache name.

        source is an entry point "package.module:fn", with fn(shard_index,
        num_shards) -> tf.data.Dataset importable on the daemon's host, or a
        tf.data.Dataset built from TF ops only (its graph is shipped and
        sharded with .shard(num_shards, i)). Shards run in workers processes
        (None: the daemon's core count). With wait (default) blocks, showing
        progress on a terminal, and returns the READY cache's CacheInfo;
        otherwise returns a MaterializeOperation (progress(), wait(), cancel()).
        resume attaches to a running or interrupted materialization of name.
        block_bytes: as for cache() (None: the daemon's default, 256 KiB blocks).
        """
        op = _materialize.start(self._home(name), source, name=name, num_shards=num_shards,
                                workers=workers, overwrite=overwrite, resume=resume,
                                block_bytes=block_bytes)
        if not wait:
            return op
        op.wait(show_progress=True)
        return self.info(name)

    # ------------------------------------------------------------------ epochs

    def _epoch_batches(self, cache: pb.Cache, layout: Layout, options: plan.ReadOptions,
                       prefetch_bytes: int, direct: direct_read.DirectReads | None,
                       epoch: int, start: int) -> Iterator[tuple[int, Any]]:
        """(count, decoded batch) of epoch over cache from position start of this share."""
        if self._tune_malloc:  # TensorFlow's py functions have applied their setting by now
            malloc.tune()
        yield from read_epoch(self._home(cache.name), cache, layout, options, epoch, start,
                              prefetch_bytes, direct)

    def _epoch_chunks(self, cache: pb.Cache, layout: Layout, options: plan.ReadOptions,
                      prefetch_bytes: int, direct: direct_read.DirectReads | None,
                      epoch: int, start: int) -> EpochChunks:
        """epoch over cache from position start of this share, in chunks (read/chunks.py)."""
        if self._tune_malloc:
            malloc.tune()
        return EpochChunks(self._home(cache.name), cache, layout, options, epoch, start,
                           prefetch_bytes, direct, self._fleet)

    def _cache_chunks(self, ready: _Committed, begin: pb.WriteBegin,
                      options: plan.ReadOptions, prefetch_bytes: int,
                      direct: direct_read.DirectReads, epoch: int, start: int) -> EpochChunks:
        """_cache_batches' epoch, in chunks."""
        return self._epoch_chunks(self._ready(ready, begin), Layout.from_json(
            begin.layout_json), options, prefetch_bytes, direct, epoch, start)

    def _cache_batches(self, ready: _Committed, begin: pb.WriteBegin,
                       options: plan.ReadOptions, prefetch_bytes: int,
                       direct: direct_read.DirectReads, epoch: int, start: int
                       ) -> Iterator[tuple[int, Any]]:
        """A read epoch of a cc.cache() dataset."""
        yield from self._epoch_batches(self._ready(ready, begin),
                                       Layout.from_json(begin.layout_json), options,
                                       prefetch_bytes, direct, epoch, start)

    def _ready(self, ready: _Committed, begin: pb.WriteBegin) -> pb.Cache:
        """The committed cache a cc.cache() dataset reads: ready.cache, when known (a read
        epoch restored from a checkpoint looks it up)."""
        cache = ready.cache
        if cache is None:
            cache = self._get(begin.name)
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

        A READ iteration reads the epoch its control took (client/tf/reads.py)."""
        if self._tune_malloc:  # from_generator has applied its own setting by now
            malloc.tune()
        writer = direct_write.writer_for(self._home(begin.name), begin, direct,  # docs/writing.md
                                          self._local_data_dir)
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

    def _write_through(self, dataset: tf.data.Dataset, fmt: BatchFormat,
                       writer: CacheWriter | None) -> Iterator[Any]:
        """Yield the source's batches, sending them to writer (None: just yield)."""
        from client.tf import convert

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

    def read_state(self, name: str, *, elements_seen: int, shuffle: bool | str = False,
                   seed: int | None = None, worker_index: int = 0, num_workers: int = 1
                   ) -> plan.ReadState:
        """Where this worker stands after consuming elements_seen elements since epoch 0.

        Pass it back as cc.dataset(name, ..., resume=state) to continue exactly
        there; it records the cache's fingerprint and the order, so resuming a
        different cache, seed, shuffle mode or worker split raises
        ResumeMismatchError instead of repeating or skipping elements.
        """
        options = plan.ReadOptions(shuffle, seed, worker_index, num_workers)
        if options.shuffle and seed is None:
            raise InvalidArgumentError("a shuffled read's state needs its seed=")
        return plan.state_of(self._get(name), options, elements_seen)


def _check_prefetch(prefetch_bytes: int) -> None:
    if not isinstance(prefetch_bytes, int) or prefetch_bytes < 1:
        raise InvalidArgumentError(f"prefetch_bytes must be a positive int, got {prefetch_bytes!r}")


def _check_checkpoint(checkpoint: bool) -> None:
    if not isinstance(checkpoint, bool):
        raise InvalidArgumentError(f"checkpoint must be True or False, got {checkpoint!r}")


def _check_same_source(cache: pb.Cache, fingerprint: str, layout: Layout) -> None:
    # leaves, not block_elements: a cache of format 1 (or other blocks) is read as it is
    if cache.fingerprint != fingerprint or (
            Layout.from_json(cache.layout_json).leaves != layout.leaves):
        raise FingerprintMismatchError(
            f"cache {cache.name!r} holds elements of a different pipeline (fingerprint "
            f"{cache.fingerprint}, this pipeline {fingerprint}); delete it with "
            f"`cacheserver rm {cache.name}` or CacheClient.delete({cache.name!r}) to rebuild "
            "it, or use another name or version=")
