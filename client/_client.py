"""CacheClient: the public entry point of the client library, a facade over its parts.

The catalog's calls (list, info, rm, pin) go through client/_daemons.py; the datasets
are client/tf/builder.py's (loaded with TensorFlow on first use); the NumPy, Grain and
PyTorch readers and cc.write() client/_arrays.py's (no TensorFlow); materialization
client/_materialize.py's. Every read opens through client/read/opening.py.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from client import _materialize, settings
from client._arrays import ArrayMethods
from client._daemons import CacheInfo, Daemons
from client._fleet import Fleet, parse_targets
from client._materialize import MaterializeOperation
from client._transport import Credentials, Pem, Transport, pb, resolve_target
from client.errors import InvalidArgumentError
from client.format.blocks import check_block_bytes
from client.observe.report import Reports
from client.read.fetching import direct as direct_read
from client.read.planning import mix as mixing
from client.read.planning import plan
from client.tf import malloc
from client.write.spare_cpu import compress_mode

if TYPE_CHECKING:
    from client.tf.builder import Dataset, DatasetBuilder


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
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _no_checkpoint_keyword(method: _Method) -> _Method:
    """Refuse the removed checkpoint= keyword with the reason, not a bare TypeError."""

    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if "checkpoint" in kwargs:
            raise InvalidArgumentError(
                f"{method.__name__}() no longer takes checkpoint=: every dataset's iterators "
                'save in tf.train.Checkpoint (docs/resume.md, "Iterator checkpoints"); drop the '
                "argument"
            )
        return method(*args, **kwargs)

    return checked  # type: ignore[return-value]


class CacheClient(ArrayMethods):
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

    job and rank name this process's reads in the figures it reports to the daemon
    every few seconds (elements, bytes, input stall; `cacheserver top`, /metrics):
    default $SHARDCACHE_JOB, else the program's name, and $SHARDCACHE_RANK, else
    TF_CONFIG's task index, else 0. report=False sends none (docs/operations.md, "Readers").
    The input stall among them is timed by the datasets cc.timed() wraps.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        targets: str | Sequence[str] | None = None,
        connect_timeout: float = 5.0,
        tune_malloc: bool = True,
        token: str | None = None,
        tls_ca: Pem | None = None,
        tls_cert: Pem | None = None,
        tls_key: Pem | None = None,
        local_data_dir: str | Path | None = None,
        job: str | None = None,
        rank: int | None = None,
        report: bool = True,
    ) -> None:
        credentials = Credentials.make(token, tls_ca, tls_cert, tls_key)
        #: How a worker process opens a client like this one (cc.source()'s pickles).
        self._opened_with = {
            "target": target,
            "targets": targets,
            "connect_timeout": connect_timeout,
            "token": token,
            "tls_ca": tls_ca,
            "tls_cert": tls_cert,
            "tls_key": tls_key,
            "local_data_dir": local_data_dir,
        }
        if target is not None and targets is not None:
            raise InvalidArgumentError("give target (one daemon) or targets (a fleet), not both")
        if targets is None and target is None:
            targets = settings.TARGETS.get()
        self._fleet: Fleet | None = None
        self._transport: Transport | None = None
        if targets is not None:
            self._fleet = Fleet(parse_targets(targets), connect_timeout, credentials)
            self.target = repr(self._fleet)
        else:
            self.target = resolve_target(target)
            self._transport = Transport(self.target, connect_timeout, credentials=credentials)
        self._daemons = Daemons(self._transport, self._fleet)
        self._tune_malloc = malloc.enabled(tune_malloc)
        self._local_data_dir = direct_read.resolve_local_data_dir(local_data_dir)
        self._reports = Reports.make(job, rank, self._daemons.home) if report else None
        _exit_hook()

    def __enter__(self) -> CacheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._reports is not None:
            self._reports.close()
        self._daemons.close()

    def __repr__(self) -> str:
        return f"CacheClient({self.target!r})"

    # ------------------------------------------------------------------ catalog

    def _get(self, name: str) -> pb.Cache:
        return self._daemons.get(name)

    def list(self, *, store: bool = False) -> list[CacheInfo]:
        """Every cache on the daemon, READY and WRITING; store=True: every cache in the
        daemon's object store instead (store_state REMOTE, or this daemon's own state).
        The list leaves the caches' shards on the daemon (num_shards counts them)."""
        request = pb.ListCachesRequest(store=store, view=pb.CACHE_VIEW_BASIC)
        response = self._daemons.call("", "ListCaches", request)
        return [CacheInfo.from_proto(c) for c in response.caches]

    def info(self, name: str) -> CacheInfo:
        """One cache; raises CacheNotFoundError when it does not exist."""
        return CacheInfo.from_proto(self._get(name))

    def delete(self, name: str, *, store: bool = False) -> tuple[bool, bool]:
        """Delete a READY cache and its files on the daemon; store=True: also its copy in
        the daemon's object store, so no daemon finds it any more. Returns what was
        removed: (the daemon's copy, the stored copy)."""
        response = self._daemons.call(
            name, "DeleteCache", pb.DeleteCacheRequest(name=name, store=store)
        )
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
            raise InvalidArgumentError(
                f"ttl must be a positive number of seconds or None, got {seconds!r}"
            )
        return self._retention(name, ttl_seconds=seconds or 0.0)

    def _retention(self, name: str, **fields: Any) -> CacheInfo:
        request = pb.SetCacheRetentionRequest(name=name, **fields)
        return CacheInfo.from_proto(self._daemons.call(name, "SetCacheRetention", request).cache)

    # ------------------------------------------------------------------ datasets

    def _reopener(self) -> Callable[[], tuple[Daemons, Path | None]]:
        """How a worker process opens a client as this one was opened (cc.source()'s pickles)."""
        return functools.partial(_reopen, self._opened_with)

    def _datasets(self) -> DatasetBuilder:
        from client.tf.builder import DatasetBuilder  # imports tensorflow

        return DatasetBuilder(self._daemons, self._local_data_dir, self._tune_malloc, self._reports)

    @_no_checkpoint_keyword
    def dataset(
        self,
        name: str,
        *,
        prefetch_bytes: int = plan.DEFAULT_PREFETCH_BYTES,
        shuffle: bool | str = False,
        seed: int | None = None,
        worker_index: int = 0,
        num_workers: int = 1,
        parallel_shards: int = 0,
        epoch: int = 0,
        start: int = 0,
        resume: plan.Resume = None,
        reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
        direct: bool | str | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        batch_size: int | None = None,
    ) -> Dataset:
        """A tf.data.Dataset over an existing READY cache; needs no source pipeline.

        shuffle=True visits every element once per epoch in an order over the
        whole cache, new each epoch, fixed by (seed, epoch); shuffle="shards"
        shuffles shards and ~1 MiB blocks within them (sequential disk reads).
        Worker worker_index of num_workers reads its disjoint share of each
        epoch. parallel_shards chunks are read at once by tf.data's threads (0:
        tf.data's AUTOTUNE picks); the order stays deterministic. epoch/start
        (or resume=, see read_state()) begin at position start of epoch's share;
        each further iteration reads the next epoch. resume= a list of the
        ReadStates of every worker of an interrupted split (any number of
        workers) makes the first iteration this worker's share of what they left
        unread of their epoch: an elastic resume. A daemon lost mid-epoch is
        reconnected to for up to reconnect_timeout seconds, continuing at the
        next undelivered element.
        See docs/reading.md.

        direct: "auto" reads the shard files themselves when this process
        runs on the daemon's host and sees its data dir (else remotely, logged
        once at INFO); True insists (DirectReadUnavailableError says why not);
        False always reads remotely. A remote read takes its bytes over the
        daemon's data plane where it has one, else over gRPC.
        None: $SHARDCACHE_DIRECT, else "auto". See docs/direct.md.

        tf.train.Checkpoint(iterator=it) saves this dataset's iterators, and
        restores them in any process (docs/resume.md, "Iterator checkpoints").

        resume_from: the backup_dir of Keras's BackupAndRestore (client.keras's,
        under Keras 3): a fit run again after an interruption continues its
        interrupted epoch at the next unseen batch of batch_size elements (this
        worker's); no backup there: epoch= (docs/resume.md, "Keras fit").
        """
        options = plan.ReadOptions.of(locals())
        if resume_from is not None and (resume is not None or start):
            raise InvalidArgumentError(
                "pass either resume_from= (a Keras backup's position) or resume=/start=, not both"
            )
        return self._datasets().dataset(name, options, resume_from)

    @_no_checkpoint_keyword
    def mix(
        self,
        weights: Mapping[str, float],
        *,
        size: int | None = None,
        seed: int | None = None,
        shuffle: bool | str = False,
        worker_index: int = 0,
        num_workers: int = 1,
        prefetch_bytes: int = plan.DEFAULT_PREFETCH_BYTES,
        parallel_shards: int = 0,
        epoch: int = 0,
        start: int = 0,
        resume: plan.Resume = None,
        reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
        direct: bool | str | None = None,
    ) -> Dataset:
        """A tf.data.Dataset mixing READY caches of one element spec by weight.

        weights maps cache names to positive weights: each epoch of size
        elements (default: all the caches' elements together) holds exactly
        each cache's share of size, rounded by largest remainder, in an order
        fixed by (seed, epoch) that interleaves the caches at random. Each cache
        is drawn as a run of its own passes (its stored order, or shuffled as
        shuffle says), without replacement until a pass is used up. seed=None
        picks a random one (one worker only). The other options are
        cc.dataset()'s: worker shares of each epoch, epoch/start, resume= with
        mix_read_state()'s states (a list of every old worker's: an elastic
        resume), direct. Its iterators save as cc.dataset()'s. See docs/reading.md,
        "Mixing caches".
        """
        weights = mixing.check_weights(weights)
        if seed is None:
            if num_workers != 1 or resume is not None:
                raise InvalidArgumentError(
                    "a mix read by several workers, or resumed, needs seed=: the order of "
                    "the mix is fixed by it (pass the seed the states were saved with)"
                )
            seed = secrets.randbits(63)
        return self._datasets().mix(weights, size, plan.ReadOptions.of(locals()))

    def mix_read_state(
        self,
        weights: Mapping[str, float],
        *,
        elements_seen: int,
        seed: int,
        size: int | None = None,
        shuffle: bool | str = False,
        worker_index: int = 0,
        num_workers: int = 1,
        resume: plan.Resume = None,
    ) -> plan.ReadState:
        """read_state() of cc.mix(weights, ...): where this worker stands after consuming
        elements_seen elements; pass it back as cc.mix(..., resume=state)."""
        weights = mixing.check_weights(weights)
        options = plan.ReadOptions.of(locals())
        mix = mixing.plan([self._get(name) for name in sorted(weights)], weights, size, seed)
        mixing.check_seed(seed, resume)
        return plan.state_of(mix, plan.apply_resume(mix, options, resume), elements_seen)

    def timed(self, dataset: Dataset) -> Dataset:
        """dataset, with the training loop's waits for each of its elements timed: the input
        stall. Wrap the loop's whole pipeline, as the last step::

            model.fit(cc.timed(ds), callbacks=[client.InputStallCallback("logs/")])

        client.InputStall and InputStallCallback read it in this process; the daemon gets it
        with the figures of the caches whose reads are alive meanwhile (`cacheserver top`,
        /metrics). The timing adds a zip and a scan per element of dataset, and a Python call
        about once a second: put it after batch(). Its iterators save with the external
        state policy IGNORE (docs/reading.md, "Is the job waiting on input?").
        """
        from client.observe.report import stalled
        from client.tf.stall import timed  # imports tensorflow

        return timed(dataset, functools.partial(stalled, reports=self._reports))

    @_no_checkpoint_keyword
    def cache(
        self,
        dataset: Dataset,
        name: str,
        *,
        version: str | None = None,
        prefetch_bytes: int = plan.DEFAULT_PREFETCH_BYTES,
        shuffle: bool | str = False,
        seed: int | None = None,
        worker_index: int = 0,
        num_workers: int = 1,
        parallel_shards: int = 0,
        epoch: int = 0,
        start: int = 0,
        resume: plan.Resume = None,
        reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
        direct: bool | str | None = None,
        block_bytes: int | None = None,
    ) -> Dataset:
        """The drop-in for ``dataset.cache()``, stored by the daemon under name.

        The first full iteration runs dataset and writes its elements through to
        the daemon while yielding them; once committed, iterations stream from
        the daemon. An iteration stopped early writes nothing. The cache is keyed
        by a fingerprint of the pipeline (or version, when given): a changed
        pipeline raises FingerprintMismatchError instead of serving old elements.

        The read options are cc.dataset()'s. They apply to iterations that read
        the cache; an iteration that writes it yields the whole source in source
        order (see docs/reading.md); direct is cc.dataset()'s too. Iterators save as
        cc.dataset()'s, a write iteration's too when the source's cardinality is known
        (restored, it runs the source on uncached: docs/resume.md, "Iterator checkpoints").
        resume= needs the cache READY.

        block_bytes: raw bytes per stored block of small fixed-shape elements
        (default $SHARDCACHE_BLOCK_BYTES, else 256 KiB); 0 stores one element per
        value, cheaper for caches read mostly with shuffle=True (docs/format.md, "Blocks").
        $SHARDCACHE_COMPRESS=spare-cpu compresses a write epoch's records only
        while the process has CPU to spare (docs/writing.md).
        """
        options = plan.ReadOptions.of(locals())
        block_bytes = check_block_bytes(block_bytes)
        compress_mode()  # a bad $SHARDCACHE_COMPRESS fails here, not in the write epoch
        return self._datasets().cache(dataset, name, version, options, block_bytes)

    def materialize(
        self,
        source: str | Dataset,
        name: str,
        *,
        num_shards: int,
        workers: int | None = None,
        overwrite: bool = False,
        wait: bool = True,
        resume: bool = False,
        block_bytes: int | None = None,
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
        op = _materialize.start(
            self._daemons.home(name),
            source,
            name=name,
            num_shards=num_shards,
            workers=workers,
            overwrite=overwrite,
            resume=resume,
            block_bytes=block_bytes,
        )
        if not wait:
            return op
        op.wait(show_progress=True)
        return self.info(name)

    def read_state(
        self,
        name: str,
        *,
        elements_seen: int,
        shuffle: bool | str = False,
        seed: int | None = None,
        worker_index: int = 0,
        num_workers: int = 1,
        resume: plan.Resume = None,
    ) -> plan.ReadState:
        """Where this worker stands after consuming elements_seen elements since epoch 0
        (with resume=: since the start of cc.dataset(name, resume=resume, ...)).

        Pass it back as cc.dataset(name, ..., resume=state) to continue exactly
        there; it records the cache's fingerprint and the order, so resuming a
        different cache, seed or shuffle mode raises ResumeMismatchError instead
        of repeating or skipping elements. The states of every worker of a split,
        as a list, resume with any number of workers (docs/resume.md).
        """
        options = plan.ReadOptions.of(locals())
        if options.shuffle and seed is None:
            raise InvalidArgumentError("a shuffled read's state needs its seed=")
        cache = self._get(name)
        return plan.state_of(cache, plan.apply_resume(cache, options, resume), elements_seen)


def _reopen(opened_with: dict[str, Any]) -> tuple[Daemons, Path | None]:
    """The daemons and local data dir of a new client opened as one was (cc.source())."""
    client = CacheClient(**opened_with)
    return client._daemons, client._local_data_dir
