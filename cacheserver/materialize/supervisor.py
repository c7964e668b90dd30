"""The supervisor thread of one materialization: its worker processes, their reports, the commit.

:func:`supervise` starts the operation's workers with the ``spawn`` context,
hands them shard indices over a queue, folds their reports into the operation
(progress, a shard done, an error), counts what they stored against the
catalog's capacity, and, once every shard is done, commits the cache, its
shards in index order. A failed or cancelled operation's files are discarded;
one stopped by a shutdown keeps its committed shards for the next start.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import time
from typing import Any

from cacheserver import metrics
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.manifest import ShardInfo
from cacheserver.materialize import worker
from cacheserver.materialize.operation import Operation, OperationError, ShardProgress, leaves
from client.wire import status

log = logging.getLogger(__name__)

#: Seconds stopped workers get to abort their shard before they are terminated.
STOP_GRACE = 20.0


def supervise(op: Operation, catalog: Catalog, job: worker.Job) -> None:
    """Run op's pending shards in workers to the end: commit, or fail and discard."""
    try:
        _run_workers(op, catalog, job)
    except Exception as exc:
        log.exception("materialization of %r failed", op.record.name)
        with op.cond:
            op.fail(OperationError(getattr(exc, "reason", "INTERNAL"), str(exc)))
    try:
        with op.cond:
            complete = op.state == "RUNNING" and len(op.committed) == op.spec.num_shards
        if complete:
            _commit(op, catalog)
    except status.CacheServerError as exc:
        with op.cond:
            op.fail(OperationError(exc.reason, str(exc)))
    with op.cond:
        if op.state == "RUNNING":
            op.fail(
                OperationError(
                    "INTERNAL", "the workers stopped with shards left; see the daemon's log"
                )
            )
        if op.state != "SUCCEEDED" and not op.shutting_down:
            catalog.discard_materialized(op.record)
        op.done, op.end_time = True, time.time()
        op.changed()
    metrics.MATERIALIZATIONS.labels(op.state).inc()
    level = logging.INFO if op.state == "SUCCEEDED" else logging.WARNING
    log.log(level, "%s %s%s", op.name, op.state, f": {op.error.message}" if op.error else "")


def _commit(op: Operation, catalog: Catalog) -> None:
    assert op.reference is not None or op.spec.num_shards == 0
    record, first = op.record, 0
    record.shards = []
    for index in range(op.spec.num_shards):
        s = op.committed[index]
        record.shards.append(ShardInfo(index, first, s.elements, s.stored_bytes, s.raw_bytes))
        first += s.elements
    assert op.reference is not None
    record.layout_json, record.element_spec = op.reference[1], op.reference[2]
    catalog.commit_materialized(record)
    with op.cond:
        op.state = "SUCCEEDED"
        op.changed()


def _run_workers(op: Operation, catalog: Catalog, job: worker.Job) -> None:
    pending = [i for i in range(op.spec.num_shards) if i not in op.committed]
    if not pending:
        return
    ctx = multiprocessing.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    tasks.cancel_join_thread()
    with op.cond:
        op.stop = ctx.Event()
        if op.state != "RUNNING":
            op.stop.set()
    for index in pending:
        tasks.put(index)
    count = min(op.workers, len(pending))
    for _ in range(count):
        tasks.put(None)
    procs = [
        ctx.Process(
            target=worker.run,
            args=(job, w, tasks, results, op.stop),
            name=f"materialize-{op.record.name}-{w}",
            daemon=True,
        )
        for w in range(count)
    ]
    for p in procs:
        p.start()
    live, current = set(range(count)), dict[int, int]()
    stopped_at = 0.0
    try:
        while live:
            try:
                msg = results.get(timeout=0.25)
            except queue.Empty:
                msg = None
            if msg is not None:
                _handle(op, msg, live, current)
                if msg[0] == "progress":
                    _reserve(op, catalog, msg[5])
            for w in list(live):
                code = procs[w].exitcode
                if code not in (None, 0):
                    live.discard(w)
                    with op.cond:
                        op.fail(_worker_died(w, code, current.get(w, -1)))
            if op.stop.is_set():
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > STOP_GRACE:
                    for w in live:
                        procs[w].terminate()
                    break
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                assert p.pid is not None  # started
                _kill_group(p.pid)  # the worker and whatever it started
                p.join()
        for q in (tasks, results):
            q.close()


def _reserve(op: Operation, catalog: Catalog, stored: int) -> None:
    """Count what the workers stored against --max-bytes, evicting to stay under it.

    Workers write first and report after, so a materialization can overshoot
    the limit by what its workers hold in flight (a batch each) before it
    evicts or fails with CAPACITY_EXCEEDED.
    """
    try:
        catalog.capacity.reserve(op.record.name, stored)
    except status.CapacityExceeded as exc:
        with op.cond:
            op.fail(OperationError(exc.reason, str(exc)))


def _handle(op: Operation, msg: tuple[Any, ...], live: set[int], current: dict[int, int]) -> None:
    kind, worker = msg[0], msg[1]
    with op.cond:
        if kind == "begin":
            _, _, shard, layout_json, spec = msg
            current[worker] = shard
            op.running[shard] = ShardProgress()
            if op.reference is None:
                op.reference = (shard, layout_json, spec)
            elif (layout_json, spec) != op.reference[1:]:
                ref = op.reference
                op.fail(
                    OperationError(
                        "INVALID_ARGUMENT",
                        f"shard {shard} yields elements of another spec than shard {ref[0]}: "
                        f"{leaves(layout_json)} vs {leaves(ref[1])}; every shard must yield "
                        "the same element_spec",
                        shard,
                    )
                )
            op.changed()
        elif kind == "progress":
            _, _, shard, n, raw, stored = msg
            s = op.running.setdefault(shard, ShardProgress())
            s.elements += n
            s.raw_bytes += raw
            s.stored_bytes += stored
            metrics.MATERIALIZED_ELEMENTS.inc(n)
            metrics.MATERIALIZED_BYTES.inc(stored)
        elif kind == "done":
            _, _, shard, n, raw, stored = msg
            op.running.pop(shard, None)
            assert op.reference is not None
            op.committed[shard] = ShardProgress(n, raw, stored, *op.reference[1:])
            metrics.MATERIALIZED_SHARDS.inc()
            op.changed()
        elif kind == "error":
            _, _, shard, reason, message = msg
            op.running.pop(shard, None)
            error = OperationError(reason, message, shard)
            op.shard_errors.append(error)
            op.fail(error)
            op.changed()
        elif kind == "exit":
            live.discard(worker)


def _worker_died(w: int, code: int, shard: int) -> OperationError:
    """A worker that exited without reporting: killed (by its pipeline, or the OOM killer)."""
    where = f"while writing shard {shard}" if shard >= 0 else "before it reported a shard"
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
        hint = (
            "; the pipeline may have killed it (os.kill, os.killpg reach only its own "
            "worker) or the kernel did (out of memory? see dmesg)"
        )
    else:
        how, hint = f"exited with status {code}", "; the pipeline may have called sys.exit"
    return OperationError("PIPELINE_FAILED", f"worker process {w} {how} {where}{hint}", shard)


def _kill_group(pid: int) -> None:
    """SIGKILL a live worker's process group (it leads one: worker.run calls setsid)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:  # died or stopped before its setsid: the pid alone
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
