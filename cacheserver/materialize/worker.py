"""One materialization worker process: runs the pipeline for its shards and writes them.

Started by :mod:`cacheserver.materialize.supervisor` with the ``spawn`` context (never a
fork of the gRPC daemon), so TensorFlow is imported here, in the worker, and
never in the daemon. Each shard is encoded exactly as write-through encodes it
(client/tf/convert.py batches the source, client/format/codec.py encodes,
client/format/values.py compresses),
stored in the shard's own LMDB environment (client/format/store.py, opened in
this process), fsynced, and committed by its marker ``shard-NNNNN.json``.

A worker leads a session and process group of its own (``os.setsid`` before any
pipeline code is imported), so ``os.killpg(os.getpgid(0), ...)`` or ``os.kill(0,
...)`` in a pipeline reaches that worker only, never the daemon, and a terminal's
Ctrl-C or hangup does not reach it either. It still dies with the daemon
(``PR_SET_PDEATHSIG`` does not depend on the group) and still runs as the daemon's
user: it can signal the daemon by pid and open any file the daemon can
(docs/operations.md, Security). It imports an entry point only if the operator's
policy allows its name, and runs it only if the function is defined in an allowed
module (:mod:`cacheserver.materialize.policy`).
Progress goes back to the daemon as tuples on a multiprocessing queue::

    ("begin", worker, shard, layout_json, element_spec)
    ("progress", worker, shard, elements, raw_bytes, stored_bytes)
    ("done", worker, shard, elements, raw_bytes, stored_bytes)
    ("error", worker, shard, reason, message)
    ("exit", worker)
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import importlib
import json
import os
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheserver.catalog.manifest import write_atomic
from cacheserver.materialize.policy import Policy
from client.errors import ShardcacheError
from client.format.blocks import BlockPacker, blocked, check_block_bytes, write_batch_elements
from client.format.store import ShardWriter
from client.wire.status import CacheServerError

ENTRY_HINT = (
    "put its directory on the daemon's path with `cacheserver serve --pythonpath DIR` "
    "or the daemon's PYTHONPATH"
)


@dataclass(frozen=True)
class Job:
    """What every worker of one operation needs (pickled to the spawned process)."""

    cache_dir: str
    num_shards: int
    entry_point: str
    graph_def: bytes
    element_spec: bytes
    pythonpath: tuple[str, ...]
    parent_pid: int
    block_bytes: int | None = None  # None: client.format.blocks' default
    #: What the operator allows (checked again here, and on the resolved function).
    policy: Policy = field(default_factory=Policy)


class Stopped(Exception):
    """The daemon asked the workers to stop (cancel, failure elsewhere, shutdown)."""


class BadPipeline(Exception):
    """The entry point or graph cannot produce a dataset: the caller's mistake."""


def shard_path(cache_dir: Path, shard: int) -> Path:
    return cache_dir / f"shard-{shard:05d}"


def marker_path(cache_dir: Path, shard: int) -> Path:
    return cache_dir / f"shard-{shard:05d}.json"


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this worker when the daemon dies (kill -9 included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # died before prctl took effect
        os._exit(1)


def _leave_daemon_group() -> None:
    """Lead a session and process group of our own, out of the daemon's."""
    with contextlib.suppress(PermissionError):  # already a leader (never when spawned)
        os.setsid()


class _Source:
    """Builds each shard's dataset from an entry point or a serialized graph."""

    def __init__(self, job: Job) -> None:
        try:
            import tensorflow as tf
        except ImportError as exc:
            raise BadPipeline(
                f"this daemon cannot materialize: its Python ({sys.executable}) has no "
                f"TensorFlow ({type(exc).__name__}: {exc}); install shardcache[tf-cpu] "
                "(or [tf]) beside the daemon, or run the image built with "
                "EXTRAS=s3,tf-cpu (make image-tf, docs/deploy.md)"
            ) from exc

        self._tf = tf
        self._job = job
        self._fn: Any = None
        self._graph_ds: Any = None
        job.policy.check(job.entry_point, not job.entry_point)
        if job.entry_point:
            self._fn = _resolve(job.entry_point)
            job.policy.check_resolved(job.entry_point, self._fn)
        else:
            from client.tf import graphs

            self._graph_ds = graphs.dataset_from_graph(job.graph_def, job.element_spec)

    def dataset(self, shard: int) -> Any:
        if self._graph_ds is not None:
            return self._graph_ds.shard(self._job.num_shards, shard)
        ds = self._fn(shard, self._job.num_shards)  # the pipeline's own errors propagate
        if not isinstance(ds, self._tf.data.Dataset):
            raise BadPipeline(
                f"entry point {self._job.entry_point!r} returned "
                f"{type(ds).__module__}.{type(ds).__qualname__} for shard {shard}; "
                "it must return a tf.data.Dataset"
            )
        return ds


def _resolve(entry_point: str) -> Any:
    module_name, _, attr = entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadPipeline(
            f"cannot import entry point {entry_point!r} on the daemon's host "
            f"({type(exc).__name__}: {exc}); {ENTRY_HINT}"
        ) from exc
    fn: Any = module
    for part in attr.split("."):
        try:
            fn = getattr(fn, part)
        except AttributeError:
            raise BadPipeline(
                f"entry point {entry_point!r}: module {module_name!r} "
                f"({getattr(module, '__file__', '?')}) has no attribute "
                f"{attr!r}"
            ) from None
    if not callable(fn):
        raise BadPipeline(
            f"entry point {entry_point!r} is a {type(fn).__name__}, not a "
            "function; it must be fn(shard_index, num_shards) -> tf.data.Dataset"
        )
    return fn


def _write_shard(
    job: Job, source: _Source, worker: int, shard: int, results: Any, should_stop: Any
) -> None:
    from client.tf import convert

    cache_dir = Path(job.cache_dir)
    path, marker = shard_path(cache_dir, shard), marker_path(cache_dir, shard)
    marker.unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)  # an uncommitted leftover is redone from scratch
    ds = source.dataset(shard)
    if convert.cardinality_of(ds) == convert.INFINITE:
        raise BadPipeline(
            f"shard {shard}'s dataset is infinite; drop the .repeat() from the "
            "pipeline (a cache holds one epoch)"
        )
    spec = ds.element_spec
    layout = blocked(convert.layout_of(spec), check_block_bytes(job.block_bytes))
    fmt = convert.BatchFormat(spec, layout)
    spec_bytes = convert.encode_spec(spec)
    results.put(("begin", worker, shard, layout.to_json(), spec_bytes))
    batch_elements = write_batch_elements(layout)
    packer = BlockPacker(layout)
    writer = ShardWriter(path, 0)

    def store(values: list[bytes], raw: int, elements: int) -> None:
        writer.append(values, raw, elements)
        results.put(("progress", worker, shard, elements, raw, sum(len(v) for v in values)))

    try:
        for n, batch in convert.source_batches(ds, fmt, batch_elements):
            if should_stop():
                raise Stopped
            store(*packer.add(batch, n))
        store(*packer.flush())
        writer.commit()
        write_atomic(
            marker,
            json.dumps(
                {
                    "index": shard,
                    "num_elements": writer.num_elements,
                    "stored_bytes": writer.stored_bytes,
                    "raw_bytes": writer.raw_bytes,
                    "layout_json": layout.to_json(),
                    "element_spec": base64.b64encode(spec_bytes).decode(),
                }
            ),
        )
    except BaseException:
        writer.abort()  # releases the shard's space now
        marker.unlink(missing_ok=True)
        raise
    results.put(("done", worker, shard, writer.num_elements, writer.raw_bytes, writer.stored_bytes))


def _classify(exc: BaseException, shard: int) -> tuple[str, str]:
    """(reason, message) for a shard's failure; the pipeline's own text is kept."""
    if isinstance(exc, BadPipeline):
        return "INVALID_ARGUMENT", str(exc)
    if isinstance(exc, (CacheServerError, ShardcacheError)):
        return exc.reason, f"shard {shard}: {exc}"
    text = getattr(exc, "message", None) or str(exc)
    return "PIPELINE_FAILED", f"shard {shard}: the pipeline raised {type(exc).__name__}: {text}"


def run(job: Job, worker: int, tasks: Any, results: Any, stop: Any) -> None:
    """The worker's main: take shard indices from tasks until None or stop."""
    _leave_daemon_group()
    _die_with_parent(job.parent_pid)
    # The daemon decides when workers stop (a shutdown keeps committed shards for
    # resuming), whoever else sends SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:0] = list(job.pythonpath)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def should_stop() -> bool:
        return stop.is_set() or os.getppid() != job.parent_pid

    source: _Source | None = None
    setup_error: BaseException | None = None
    try:
        source = _Source(job)
    except Exception as exc:  # reported against each shard this worker takes
        setup_error = exc
    try:
        while not should_stop():
            shard = tasks.get()
            if shard is None:
                break
            try:
                if setup_error is not None:
                    raise setup_error
                assert source is not None
                _write_shard(job, source, worker, shard, results, should_stop)
            except Stopped:
                break
            except Exception as exc:
                reason, message = _classify(exc, shard)
                if reason in ("PIPELINE_FAILED", "INTERNAL"):
                    traceback.print_exc()
                results.put(("error", worker, shard, reason, message))
                break
    finally:
        results.put(("exit", worker))
