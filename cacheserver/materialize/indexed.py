"""Materialization as a Kubernetes Indexed Job: each index builds its shards into the store.

``cacheserver materialize ENTRY --name N --shards S --index I --indexes K --store
s3://BUCKET/PREFIX`` runs in the Job's pod, without a daemon. Index ``I`` builds the
shards ``s`` with ``s % K == I`` (round robin: every index gets S/K shards, one more
or less, spread over the whole cache, so a pipeline whose cost grows or shrinks with
the shard index still splits evenly).

Each shard is built into a local temp dir by the daemon's own worker code
(:mod:`cacheserver.materialize.worker`: the same encoding, layout and block size),
then its ``data.mdb`` is uploaded under a fresh ``<name>/objects/<upload>/`` key and
its marker (:class:`cacheserver.catalog.stored.ShardMarker`) created with
If-None-Match: * under ``<name>/job-<fingerprint>/``. The marker is the shard's
commit point: a shard whose marker exists is skipped, so a retried index redoes only
what its killed attempt had not published; an attempt whose marker create loses (two
pods ran one index) deletes its own object. The fingerprint is the daemon's for the
same entry point and shard count (:func:`~cacheserver.materialize.operation.source_fingerprint`).

Whichever index, after its own shards, finds every marker present assembles the
manifest (:func:`cacheserver.catalog.stored.assemble`) and creates it, again with
If-None-Match: *; a lost race is fine, the other manifest describes the same shards.
With the manifest in place it deletes the objects under ``<name>/objects/`` that
neither the manifest nor a marker names: what attempts killed between an upload and
its marker left behind (any later upload for those shards loses its marker create and
deletes itself). Daemons started with ``--store`` then find the cache by its manifest.

Only the entry point named on the command line runs, under the worker's import rules
(no dunder attributes; the function must be defined in the module named).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cacheserver.catalog import stored
from cacheserver.catalog.manifest import ShardInfo, validate_name
from cacheserver.catalog.stored import ShardMarker, StoredCache
from cacheserver.materialize import worker
from cacheserver.materialize.operation import source_fingerprint
from cacheserver.materialize.policy import Policy
from cacheserver.tier.bucket import Bucket, StoreURL
from client.wire.status import CacheServerError, InvalidArgument

Emit = Callable[[str], None]


class JobFailed(Exception):
    """This index cannot finish; permanent: a retry of the same command fails the same way."""

    def __init__(self, message: str, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class IndexedJob:
    """One index of an Indexed Job: what it runs and where it publishes."""

    entry_point: str
    name: str
    num_shards: int
    index: int
    indexes: int
    store: str
    endpoint: str | None = None
    block_bytes: int | None = None

    @property
    def fingerprint(self) -> str:
        return source_fingerprint(self.entry_point, b"", self.num_shards)

    @property
    def shards(self) -> list[int]:
        """This index's shards: s % indexes == index."""
        return list(range(self.index, self.num_shards, self.indexes))

    def check(self) -> None:
        """InvalidArgument (with what to pass instead) for arguments that cannot work."""
        validate_name(self.name)
        StoreURL.parse(self.store)
        Policy.from_settings([self.entry_point])  # a name, not code
        if ":" not in self.entry_point:
            raise InvalidArgument(
                f"entry point {self.entry_point!r} is not of the form 'package.module:function'"
            )
        if not 1 <= self.num_shards <= 10_000:
            raise InvalidArgument(f"--shards is {self.num_shards}; it must be 1 to 10,000")
        if not 1 <= self.indexes <= self.num_shards:
            raise InvalidArgument(
                f"--indexes is {self.indexes}; it must be 1 to --shards "
                f"({self.num_shards}): an index past the shard count would "
                "have nothing to build"
            )
        if not 0 <= self.index < self.indexes:
            raise InvalidArgument(
                f"--index is {self.index}; it must be 0 to {self.indexes - 1} "
                "(the Job's completion index, $JOB_COMPLETION_INDEX)"
            )


class _Report:
    """Collects what worker._write_shard reports for one shard (its results queue)."""

    def __init__(self) -> None:
        self.layout_json, self.element_spec = "", b""
        self.counts: tuple[int, int, int] = (0, 0, 0)  # elements, raw bytes, stored bytes

    def put(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "begin":
            self.layout_json, self.element_spec = msg[3], msg[4]
        elif msg[0] == "done":
            self.counts = (msg[3], msg[4], msg[5])


def run(job: IndexedJob, emit: Emit) -> bool:
    """Build and publish this index's shards; True if this run created the manifest.

    Raises JobFailed (permanent or not), or CacheServerError from the store
    (StoreUnavailable: a retry may cure; others: permanent)."""
    try:
        job.check()
    except (InvalidArgument, ValueError) as exc:
        raise JobFailed(str(exc), permanent=True) from None
    bucket = Bucket(job.store, job.endpoint)
    start = time.time()
    there = _stored(bucket, job)
    if there is not None:
        emit(
            f"cache {job.name!r} is already in {bucket}: {len(there.objects)} shards, "
            f"{there.record.num_elements:,} elements; nothing to do"
        )
        return False
    mine = job.shards
    emit(
        f"index {job.index}/{job.indexes}: shards {_ranges(mine)} of {job.num_shards} "
        f"({job.fingerprint})"
    )
    published = _published(job, bucket)
    todo = [s for s in mine if s not in published]
    for s in sorted(set(mine) & published):
        emit(f"shard {s}: skipped, already published")
    if todo:
        _build(job, bucket, todo, emit)
    published = _published(job, bucket)
    if len(published) < job.num_shards:
        emit(
            f"index {job.index}/{job.indexes} done: {len(published)} of {job.num_shards} "
            "shards published; the index that publishes the last one writes the manifest"
        )
        return False
    markers = _markers(job, bucket)
    try:
        cache = stored.assemble(job.name, job.fingerprint, markers, start, time.time())
        _same_spec(markers)
    except ValueError as exc:
        raise JobFailed(
            f"cannot assemble cache {job.name!r} from its shards: {exc}; every "
            "shard must yield the same element_spec: fix the pipeline, remove the "
            f"job's markers (cacheserver rm --store {job.name}) and run the Job "
            "again",
            permanent=True,
        ) from None
    made = bucket.create(stored.manifest_key(job.name), cache.to_doc())
    if not made:  # another index assembled it first: the same shards, unless it is another cache
        cache = _stored(bucket, job) or cache
    _sweep(job, bucket, cache, markers, emit)
    emit(
        f"cache {job.name!r} "
        + ("published" if made else "was published by another index")
        + f": {cache.record.num_elements:,} elements in {job.num_shards} shards, "
        f"{_size(cache.size)}: {bucket}/{stored.manifest_key(job.name)}"
    )
    return made


def _stored(bucket: Bucket, job: IndexedJob) -> StoredCache | None:
    """The cache the store holds under the name; JobFailed if it is another cache."""
    doc = bucket.get_json(stored.manifest_key(job.name))
    if doc is None:
        return None
    try:
        cache = StoredCache.from_doc(job.name, doc)
    except ValueError as exc:
        raise JobFailed(
            f"{bucket}/{stored.manifest_key(job.name)} is not a manifest shardcache "
            f"can read ({exc}); remove it (cacheserver rm --store {job.name}) and "
            "run the Job again",
            permanent=True,
        ) from None
    if cache.record.fingerprint != job.fingerprint:
        raise JobFailed(
            f"the store already holds cache {job.name!r} built from "
            f"{cache.record.fingerprint!r}, not {job.fingerprint!r}: pick another "
            f"--name, or remove it first (cacheserver rm --store {job.name})",
            permanent=True,
        )
    return cache


def _marker(job: IndexedJob, shard: int) -> str:
    return stored.marker_key(job.name, job.fingerprint, shard)


def _build(job: IndexedJob, bucket: Bucket, shards: list[int], emit: Emit) -> None:
    """Build each shard locally with the worker's code, upload it, create its marker."""
    spec = worker.Job(
        cache_dir=tempfile.mkdtemp(prefix=f"shardcache-{job.name}-"),
        num_shards=job.num_shards,
        entry_point=job.entry_point,
        graph_def=b"",
        element_spec=b"",
        pythonpath=(),
        parent_pid=0,
        block_bytes=job.block_bytes,
        policy=Policy.from_settings([job.entry_point]),
    )
    upload = stored.new_upload()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        try:
            source = worker._Source(spec)  # imports TensorFlow and resolves the entry point
        except (worker.BadPipeline, CacheServerError) as exc:  # CacheServerError: import rules
            raise JobFailed(str(exc), permanent=True) from None
        except Exception as exc:  # the entry point's module raised while imported
            raise JobFailed(
                f"importing entry point {job.entry_point!r} raised {type(exc).__name__}: {exc}",
                permanent=False,
            ) from exc
        for s in shards:
            _one_shard(job, spec, source, bucket, upload, s, emit)
    finally:
        shutil.rmtree(spec.cache_dir, ignore_errors=True)


def _one_shard(
    job: IndexedJob,
    spec: worker.Job,
    source: Any,
    bucket: Bucket,
    upload: str,
    shard: int,
    emit: Emit,
) -> None:
    if bucket.get_json(_marker(job, shard)) is not None:  # another pod of this index ran
        emit(f"shard {shard}: skipped, already published")
        return
    report, began = _Report(), time.monotonic()
    try:
        worker._write_shard(spec, source, 0, shard, report, lambda: False)
    except Exception as exc:
        reason, message = worker._classify(exc, shard)
        raise JobFailed(message, permanent=reason == "INVALID_ARGUMENT") from exc
    elements, raw, stored_bytes = report.counts
    emit(
        f"shard {shard}: built, {elements:,} elements, {_size(stored_bytes)} "
        f"in {time.monotonic() - began:.1f}s"
    )
    directory = worker.shard_path(Path(spec.cache_dir), shard)
    obj = bucket.upload(directory / "data.mdb", stored.object_key(job.name, upload, shard))
    emit(f"shard {shard}: uploaded {obj.key} ({_size(obj.size)})")
    marker = ShardMarker(
        ShardInfo(shard, 0, elements, stored_bytes, raw),
        obj,
        report.layout_json,
        report.element_spec,
    )
    if bucket.create(_marker(job, shard), marker.to_doc()):
        emit(f"shard {shard}: published")
    else:
        bucket.delete([obj.key])
        emit(
            f"shard {shard}: skipped, another attempt published it first (this attempt's "
            "object deleted)"
        )
    shutil.rmtree(directory, ignore_errors=True)
    worker.marker_path(Path(spec.cache_dir), shard).unlink(missing_ok=True)


def _published(job: IndexedJob, bucket: Bucket) -> set[int]:
    """The shards whose marker exists (one listing)."""
    prefix = _marker(job, 0).rsplit("/", 1)[0] + "/"
    keys = {key for key, _ in bucket.keys(prefix)}
    return {s for s in range(job.num_shards) if _marker(job, s) in keys}


def _markers(job: IndexedJob, bucket: Bucket) -> list[ShardMarker]:
    """Every shard's marker, in shard order (all exist)."""
    out: list[ShardMarker] = []
    for s in range(job.num_shards):
        doc = bucket.get_json(_marker(job, s))
        try:
            if doc is None:
                raise ValueError("it is gone (removed while this index ran?)")
            out.append(ShardMarker.from_doc(doc))
        except ValueError as exc:
            raise JobFailed(
                f"{bucket}/{_marker(job, s)}: {exc}; remove it and run index "
                f"{s % job.indexes} again",
                permanent=True,
            ) from None
    return out


def _same_spec(markers: list[ShardMarker]) -> None:
    nonempty = [m for m in markers if m.shard.num_elements] or markers
    specs = {m.element_spec for m in nonempty}
    if len(specs) != 1:
        raise ValueError("shards disagree on the element_spec")


def _sweep(
    job: IndexedJob, bucket: Bucket, cache: StoredCache, markers: list[ShardMarker], emit: Emit
) -> None:
    """With the manifest in place: delete the objects that neither it nor a marker names.

    Those are uploads of attempts killed before their marker create. Any attempt still
    uploading now finds its marker taken and deletes its own object."""
    named = {o.key for o in cache.objects} | {m.object.key for m in markers}
    ours = {_marker(job, s) for s in range(job.num_shards)}
    objects = []
    for key, _ in bucket.keys(f"{job.name}/"):
        if key.startswith(f"{job.name}/objects/"):
            objects.append(key)
        elif "/job-" in key and key.endswith(".json") and key not in ours:
            named |= _named_by(bucket, key)  # another Job's marker (another shard count)
    stray = [key for key in objects if key not in named]
    if stray:
        bucket.delete(stray)
        emit(f"deleted {len(stray)} object(s) that interrupted attempts left unpublished")


def _named_by(bucket: Bucket, marker: str) -> set[str]:
    doc: Any = bucket.get_json(marker)
    try:
        return {str(doc["object"]["key"])}
    except (KeyError, TypeError):
        return set()


def _ranges(shards: list[int]) -> str:
    text = json.dumps(shards[:8])[1:-1]
    return text + (f", ... ({len(shards)})" if len(shards) > 8 else "")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
