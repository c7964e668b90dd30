"""Server-side materialization: the daemon runs a pipeline, shard by shard, in workers.

A long-running operation (AIP-151 style) named ``materialize/<cache>``. Its
supervisor thread (:mod:`cacheserver.materialize.supervisor`) starts ``workers``
processes with the ``spawn`` context (never a fork of the gRPC daemon; TensorFlow
loads only in them, see :mod:`cacheserver.materialize.worker`), hands them shard
indices over a queue, aggregates their progress, checks that every shard yields
the same element layout and spec, and commits the cache (manifest.json) last, its
shards in index order, so global element indices follow shard order. This module
starts, finds, watches, cancels and resumes operations.

Only what the operator allowed runs (:mod:`cacheserver.materialize.policy`:
``--materialize-allow``, ``--allow-shipped-pipelines``), checked before anything
is imported or any worker starts, and again for an interrupted operation before
it is resumed. Workers lead a session of their own (see
:mod:`cacheserver.materialize.worker`), so a pipeline's ``os.killpg``/``os.kill(0,
...)`` reaches its worker, not the daemon.

What runs is saved in the cache directory (``materialize.json``). After a
crash the catalog keeps such a cache WRITING; :meth:`Materializer.resume_interrupted`
keeps the shards whose markers were written, deletes the others and runs the
rest again. A failed or cancelled operation discards the cache's files.

Knows nothing of gRPC: the service layer translates.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator

from cacheserver import metrics
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.manifest import MATERIALIZE_SPEC, validate_name
from cacheserver.materialize import worker
from cacheserver.materialize.operation import (
    Operation,
    OperationError,
    ShardProgress,
    Snapshot,
    Spec,
    committed_shard,
    describe,
    source_fingerprint,
)
from cacheserver.materialize.policy import Policy
from cacheserver.materialize.supervisor import STOP_GRACE, supervise
from client.format.layout import MAX_BLOCK_BYTES
from client.wire import status
from client.wire.status import (
    CacheWriting,
    InvalidArgument,
    MaterializeNotAllowed,
    OperationNotFound,
)

log = logging.getLogger(__name__)

MAX_SHARDS = 10_000
MAX_WORKERS = 256
_ENTRY_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class Materializer:
    """Runs materialization operations for one catalog, as far as policy allows."""

    def __init__(
        self,
        catalog: Catalog,
        pythonpath: tuple[str, ...] = (),
        default_workers: int | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.catalog = catalog
        #: Nothing is allowed unless the operator says so.
        self.policy = policy or Policy()
        log.info(
            "materialization runs %s; shipped pipelines are %s",
            f"entry points of {', '.join(self.policy.allow)}"
            if self.policy.allow
            else "no entry points (none allowed: --materialize-allow)",
            "allowed" if self.policy.shipped_pipelines else "refused (--allow-shipped-pipelines)",
        )
        self.pythonpath = tuple(str(p) for p in pythonpath)
        self.default_workers = default_workers or len(os.sched_getaffinity(0)) or 1
        self._lock = threading.Lock()
        self._ops: dict[str, Operation] = {}

    # ------------------------------------------------------------------ API

    def start(
        self,
        name: str,
        *,
        entry_point: str = "",
        graph_def: bytes = b"",
        element_spec: bytes = b"",
        num_shards: int,
        workers: int = 0,
        overwrite: bool = False,
        resume: bool = False,
        fingerprint: str = "",
        block_bytes: int | None = None,
    ) -> Snapshot:
        validate_name(name)
        spec = self._check(
            entry_point, graph_def, element_spec, num_shards, workers, fingerprint, block_bytes
        )
        self.policy.check(spec.entry_point, bool(spec.graph_def))  # before anything runs
        with self._lock:
            op = self._ops.get(name)
            if op is not None and not op.done:
                if not resume:
                    progress = op.snapshot()
                    raise CacheWriting(
                        f"cache {name!r} is being materialized by operation {op.name} "
                        f"({progress.shards_done}/{progress.shards_total} shards); attach to it "
                        "with --resume (resume=True) or cancel it"
                    )
                if not op.spec.same_source(spec):
                    raise InvalidArgument(
                        f"cannot resume {op.name}: it runs {describe(op.spec)}, this request "
                        f"asks for {describe(spec)}; cancel it first to start over"
                    )
                return op.snapshot()
            if resume:
                done = self._already_done(name, spec)
                if done is not None:
                    return done
            record = self.catalog.begin_materialize(
                name, spec.fingerprint, spec.to_json(), overwrite
            )
            op = self._ops[name] = Operation(spec, record, self._workers(spec))
        self._launch(op)
        log.info("materializing cache %r: %s over %d workers", name, describe(spec), op.workers)
        return op.snapshot()

    def get(self, op_name: str) -> Snapshot:
        return self._find(op_name).snapshot()

    def watch(
        self, op_name: str, interval: float, active: Callable[[], bool]
    ) -> Iterator[Snapshot]:
        """Snapshots on every change and at least every interval; the last one is done."""
        op = self._find(op_name)
        interval = min(max(interval or 0.5, 0.05), 60.0)
        seen = -1
        while True:
            with op.cond:
                if op.version == seen:
                    op.cond.wait(interval)
                seen = op.version
            snap = op.snapshot()
            yield snap
            if snap.done or not active():
                return

    def cancel(self, op_name: str) -> Snapshot:
        op = self._find(op_name)
        with op.cond:
            op.fail(
                OperationError("OPERATION_CANCELLED", f"{op.name} was cancelled"), state="CANCELLED"
            )
        return op.snapshot()

    def resume_interrupted(self) -> None:
        """Restart every materialization a crash interrupted (catalog.interrupted)."""
        for record in self.catalog.interrupted:
            directory = self.catalog.cache_dir(record.name)
            try:
                spec = Spec.from_json((directory / MATERIALIZE_SPEC).read_text())
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning(
                    "discarding cache %r: its materialization cannot be resumed (%s)",
                    record.name,
                    exc,
                )
                self.catalog.discard_materialized(record)
                continue
            op = Operation(spec, record, self._workers(spec))
            try:
                self.policy.check(spec.entry_point, bool(spec.graph_def))
            except MaterializeNotAllowed as exc:
                self._refuse_resuming(op, exc)
                continue
            for index in range(spec.num_shards):
                shard = committed_shard(directory, index)
                if shard is not None:
                    op.committed[index] = shard
                    op.resumed_shards.add(index)
                    op.reference = op.reference or (index, shard.layout_json, shard.element_spec)
                else:
                    shutil.rmtree(worker.shard_path(directory, index), ignore_errors=True)
            with self._lock:
                self._ops[record.name] = op
            log.info(
                "resuming materialization of cache %r: %d of %d shards were committed",
                record.name,
                op.resumed,
                spec.num_shards,
            )
            self._launch(op)
        self.catalog.interrupted = []

    def _refuse_resuming(self, op: Operation, exc: MaterializeNotAllowed) -> None:
        """An interrupted operation the operator no longer allows: FAILED, its files gone."""
        with op.cond:
            op.fail(OperationError(exc.reason, str(exc)))
            op.done, op.end_time = True, time.time()
        self.catalog.discard_materialized(op.record)
        with self._lock:
            self._ops[op.record.name] = op
        metrics.MATERIALIZATIONS.labels(op.state).inc()
        log.warning("materialization of cache %r not resumed: %s", op.record.name, exc)

    def shutdown(self, timeout: float = STOP_GRACE + 10) -> None:
        """Stop every running operation, keeping committed shards for the next start."""
        with self._lock:
            ops = [op for op in self._ops.values() if not op.done]
        for op in ops:
            with op.cond:
                op.shutting_down = True
                op.fail(
                    OperationError(
                        "SHUTTING_DOWN",
                        f"the daemon shut down during {op.name};"
                        " it resumes when the daemon starts again",
                    )
                )
        for op in ops:
            if op.thread is not None:
                op.thread.join(timeout)

    # ------------------------------------------------------------------ checks

    def _check(
        self,
        entry_point: str,
        graph_def: bytes,
        element_spec: bytes,
        num_shards: int,
        workers: int,
        fingerprint: str,
        block_bytes: int | None,
    ) -> Spec:
        if bool(entry_point) == bool(graph_def):
            raise InvalidArgument(
                "give exactly one of an entry point ('package.module:fn') "
                "and a serialized dataset graph"
            )
        if entry_point and not _ENTRY_RE.fullmatch(entry_point):
            raise InvalidArgument(
                f"entry point {entry_point!r} is not of the form 'package.module:function'"
            )
        if graph_def and not element_spec:
            raise InvalidArgument("a dataset graph needs its element_spec")
        if num_shards < 1:
            raise InvalidArgument(f"num_shards is {num_shards}; it must be at least 1")
        if num_shards > MAX_SHARDS:
            raise InvalidArgument(
                f"num_shards is {num_shards:,}; the limit is {MAX_SHARDS:,} "
                "(each shard is an LMDB environment and a worker task): "
                "use fewer, larger shards"
            )
        if workers > MAX_WORKERS:
            raise InvalidArgument(
                f"workers is {workers}; the limit is {MAX_WORKERS} (one "
                "process each; the default is the daemon's core count)"
            )
        if block_bytes is not None and block_bytes > MAX_BLOCK_BYTES:
            raise InvalidArgument(
                f"block_bytes is {block_bytes:,}; the limit is "
                f"{MAX_BLOCK_BYTES:,} (each worker holds a block in memory; "
                "256 KiB is the default, 0 stores one element per value)"
            )
        return Spec(
            entry_point,
            graph_def,
            element_spec,
            num_shards,
            workers,
            source_fingerprint(entry_point, graph_def, num_shards, fingerprint),
            block_bytes,
        )

    def _workers(self, spec: Spec) -> int:
        return max(1, min(spec.workers or self.default_workers, spec.num_shards))

    def _already_done(self, name: str, spec: Spec) -> Snapshot | None:
        """resume of a cache already READY from the same source: a finished operation."""
        try:
            record = self.catalog.get(name)
        except status.CacheNotFound:
            return None
        if record.state != "READY" or record.fingerprint != spec.fingerprint:
            return None
        op = Operation(
            spec,
            record,
            0,
            state="SUCCEEDED",
            done=True,
            start_time=record.create_time,
            end_time=record.commit_time,
        )
        for s in record.shards:
            op.committed[s.index] = ShardProgress(s.num_elements, s.raw_bytes, s.stored_bytes)
        op.resumed_shards = set(op.committed)
        self._ops[name] = op  # (self._lock is held) so that watching it finds it
        return op.snapshot()

    def _find(self, op_name: str) -> Operation:
        cache = op_name.removeprefix("materialize/")
        with self._lock:
            op = self._ops.get(cache) if op_name.startswith("materialize/") else None
        if op is None:
            raise OperationNotFound(
                f"operation {op_name!r} not found; operations are named "
                "'materialize/<cache>' and live until the daemon restarts"
            )
        return op

    # ------------------------------------------------------------------ running

    def _launch(self, op: Operation) -> None:
        job = worker.Job(
            str(self.catalog.cache_dir(op.record.name)),
            op.spec.num_shards,
            op.spec.entry_point,
            op.spec.graph_def,
            op.spec.element_spec,
            self.pythonpath,
            os.getpid(),
            op.spec.block_bytes,
            self.policy,
        )
        op.thread = threading.Thread(
            target=supervise,
            args=(op, self.catalog, job),
            name=f"materialize-{op.record.name}",
            daemon=True,
        )
        op.thread.start()
