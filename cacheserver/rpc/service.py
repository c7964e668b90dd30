"""The gRPC adapter: translates requests to catalog calls and errors to statuses.

It decides nothing; the logic lives in :mod:`cacheserver.catalog`,
:mod:`cacheserver.materialize` and, for who may do what, :mod:`cacheserver.access`
(asked through rpc/callers.py).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from cacheserver import metrics
from cacheserver.access import Authority, Verb
from cacheserver.catalog import reads, remote
from cacheserver.catalog.catalog import Catalog
from cacheserver.catalog.direct_writes import StagedShard
from cacheserver.catalog.leases import LeaseTable
from cacheserver.catalog.manifest import CacheRecord
from cacheserver.catalog.remote import StoreTier
from cacheserver.catalog.retention import Retention
from cacheserver.catalog.writes import CacheWrite
from cacheserver.logs import shown
from cacheserver.materialize.materializer import Materializer
from cacheserver.reader_reports import READERS
from cacheserver.rpc import validate
from cacheserver.rpc.callers import Callers
from cacheserver.rpc.operations import operation_to_proto
from cacheserver.rpc.streams import BegunGuard
from cacheserver.security import peer_ip
from client.wire.chunks import encode_read_shard_response, read_shard_data_bytes
from client.wire.status import (
    REASON_KEY,
    CacheNotFound,
    CacheServerError,
    InvalidArgument,
    ShuttingDown,
)
from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_STATES = {"WRITING": pb.CACHE_STATE_WRITING, "READY": pb.CACHE_STATE_READY}
_DECISIONS = {
    "ACCEPTED": pb.WRITE_DECISION_ACCEPTED,
    "ALREADY_READY": pb.WRITE_DECISION_ALREADY_READY,
    "BUSY": pb.WRITE_DECISION_BUSY,
}


_STORE_STATES = {
    state: pb.StoreState.Value(f"STORE_STATE_{state}")
    for state in (
        remote.LOCAL,
        remote.PUBLISHING,
        remote.STORED,
        remote.PULLING,
        remote.CONFLICT,
        remote.REMOTE,
    )
}


def _remote(record: CacheRecord, shards: bool = True) -> pb.Cache:
    """A cache only the object store holds."""
    cache = to_proto(record, shards=shards)
    cache.disk_bytes = 0
    cache.store.state = pb.STORE_STATE_REMOTE
    cache.store.total_bytes = record.disk_bytes
    return cache


def to_proto(
    record: CacheRecord, retention: Retention | None = None, shards: bool = True
) -> pb.Cache:
    """The wire's Cache of record; shards=False: the BASIC view, num_shards without them."""
    retention = retention or Retention()
    raw = sum(s.raw_bytes for s in record.shards)
    stored = sum(s.stored_bytes for s in record.shards)
    return pb.Cache(
        name=record.name,
        state=_STATES[record.state],
        fingerprint=record.fingerprint,
        layout_json=record.layout_json,
        element_spec=record.element_spec,
        num_elements=record.num_elements,
        disk_bytes=record.disk_bytes,
        raw_bytes=raw,
        stored_bytes=stored,
        create_time=record.create_time,
        commit_time=record.commit_time,
        num_shards=len(record.shards),
        shards=[
            pb.Shard(
                index=s.index,
                first_element=s.first_element,
                num_elements=s.num_elements,
                stored_bytes=s.stored_bytes,
                raw_bytes=s.raw_bytes,
            )
            for s in (record.shards if shards else ())
        ],
        pinned=retention.pinned,
        ttl_seconds=retention.ttl_seconds,
        last_read_time=retention.last_read_time,
        hits=retention.hits,
    )


#: Failures on the daemon's side, worth an operator's attention; the rest are the caller's.
_OPERATOR_CODES = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DATA_LOSS)


def _abort(context: grpc.ServicerContext, exc: CacheServerError) -> None:
    log.log(
        logging.WARNING if exc.code in _OPERATOR_CODES else logging.DEBUG,
        "%s: %s",
        exc.reason,
        shown(str(exc), 1000),
    )
    context.set_trailing_metadata(((REASON_KEY, exc.reason),))
    context.abort(exc.code, str(exc))


def _translating(method: F) -> F:
    """Turn CacheServerError into a status; log and hide anything unexpected."""

    @functools.wraps(method)
    def unary(self: CacheService, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except CacheServerError as exc:
            _abort(context, exc)
        except Exception:
            log.exception("%s failed", method.__name__)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error in {method.__name__}; see the daemon's log",
            )

    @functools.wraps(method)
    def streaming(self: CacheService, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            yield from method(self, request, context)
        except CacheServerError as exc:
            _abort(context, exc)
        except Exception:
            if not context.is_active():
                return  # the caller went away; nothing to report
            log.exception("%s failed", method.__name__)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error in {method.__name__}; see the daemon's log",
            )

    return streaming if inspect.isgeneratorfunction(method) else unary  # type: ignore[return-value]


class CacheService(pb_grpc.CacheServiceServicer):
    """Serves one catalog. Tracks open streams so shutdown can drain them."""

    def __init__(
        self,
        catalog: Catalog,
        materializer: Materializer | None = None,
        leases: LeaseTable | None = None,
        callers: Callers | None = None,
        report_readers: bool = True,
    ) -> None:
        self.catalog = catalog
        self.materializer = materializer or Materializer(catalog)
        self.leases = leases or LeaseTable(catalog)
        self.callers = callers or Callers(Authority(None))
        self.callers.end_leases_with_grants(self.leases)
        #: Keep the readers' reports for /metrics (off: accepted and dropped).
        self.report_readers = report_readers
        self._draining = threading.Event()
        #: The data plane's port, set when it serves (cacheserver/plane); 0: none.
        self.data_port = 0
        self._fallback_peers: set[str] = set()

    def drain(self) -> None:
        """Refuse new write streams from now on (reads in flight continue)."""
        self._draining.set()

    @_translating
    def ListCaches(
        self, request: pb.ListCachesRequest, context: grpc.ServicerContext
    ) -> pb.ListCachesResponse:
        caller = self.callers.of(context)
        shards = request.view != pb.CACHE_VIEW_BASIC  # UNSPECIFIED: FULL
        if not request.store:
            return pb.ListCachesResponse(
                caches=[
                    self._proto(r, shards)
                    for r in self.catalog.list()
                    if caller.may(Verb.READ, r.name)
                ]
            )
        tier = self._tier()
        local = {r.name for r in self.catalog.list()}
        return pb.ListCachesResponse(
            caches=[
                self._proto(s.record, shards)
                if s.record.name in local
                else _remote(s.record, shards)
                for s in tier.list_stored()
                if caller.may(Verb.READ, s.record.name)
            ]
        )

    @_translating
    def GetCache(
        self, request: pb.GetCacheRequest, context: grpc.ServicerContext
    ) -> pb.GetCacheResponse:
        validate.name(request.name)
        self.callers.check(context, Verb.READ, request.name)
        try:
            return pb.GetCacheResponse(cache=self._proto(self.catalog.get(request.name)))
        except CacheNotFound:
            stored = self.catalog.tier.find(request.name) if self.catalog.tier else None
            if stored is None:
                raise
            return pb.GetCacheResponse(cache=_remote(stored.record))

    @_translating
    def DeleteCache(
        self, request: pb.DeleteCacheRequest, context: grpc.ServicerContext
    ) -> pb.DeleteCacheResponse:
        validate.name(request.name)
        self.callers.check(context, Verb.ADMIN, request.name)
        local, stored = self.catalog.delete(request.name, store=request.store)
        log.info(
            "deleted cache %r (%s)",
            request.name,
            " and ".join(
                w
                for w, done in (("this daemon's copy", local), ("the stored copy", stored))
                if done
            ),
        )
        return pb.DeleteCacheResponse(local=local, stored=stored)

    def _tier(self) -> StoreTier:
        if self.catalog.tier is None:
            raise InvalidArgument(
                "this daemon has no object store (start it with serve --store s3://BUCKET/PREFIX)"
            )
        return self.catalog.tier

    @_translating
    def ReadShard(
        self, request: pb.ReadShardRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """Serialized ReadShardResponses (streams.wire_handlers passes them as they are)."""
        validate.read(request.name, request.fingerprint)
        self.callers.check(context, Verb.READ, request.name, "ReadShard")
        whole_shard = request.start == 0 and not request.count
        with reads.reading(self.catalog, request.name, hit=request.epoch_start or whole_shard):
            chunks = reads.read_shard(
                self.catalog,
                request.name,
                request.shard,
                request.start,
                request.chunk_bytes,
                request.fingerprint,
                request.count,
                join=encode_read_shard_response,
            )
            self._plane_missed(context, request.name)
            for _start, _lengths, message, elements in chunks:  # serialized responses
                metrics.READ_BYTES.labels("grpc").inc(read_shard_data_bytes(message))
                metrics.READ_ELEMENTS.inc(elements)
                yield message

    @_translating
    def WriteCache(
        self, request_iterator: Iterator[pb.WriteCacheRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.WriteCacheResponse]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("request") != "begin":
            raise InvalidArgument("a WriteCache stream must start with a WriteBegin")
        if self._draining.is_set():
            raise ShuttingDown("the daemon is shutting down; retry against its replacement")
        begin = first.begin
        validate.write_begin(
            begin.name, begin.fingerprint, begin.layout_json, begin.element_spec, begin.shard_bytes
        )
        self.callers.check(context, Verb.WRITE, begin.name, "WriteCache")
        decision, record, session = self.catalog.begin_write(
            begin.name, begin.fingerprint, begin.layout_json, begin.element_spec, begin.shard_bytes
        )
        begun = pb.WriteBegun(decision=_DECISIONS[decision], cache=self._proto(record))
        if session is None:
            yield pb.WriteCacheResponse(begun=begun)
            return
        guard = BegunGuard(session, context)  # from here on, the session ends with the RPC
        if begin.local:  # same-host writes (docs/writing.md)
            begun.local_dir = str(session.stage().relative_to(self.catalog.data_dir))
            begun.data_dir, begun.instance_token = str(self.leases.data_dir), self.leases.token
            begun.shard_bytes = session.shard_bytes
        yield pb.WriteCacheResponse(begun=begun)
        if not guard.resumed():
            log.warning(
                "write of cache %r was cancelled before it sent anything; discarded", begin.name
            )
            return
        metrics.CACHE_MISSES.inc()
        log.info("writing cache %r (fingerprint %s)", begin.name, shown(begin.fingerprint))
        with CacheWrite(session) as write:
            for req in request_iterator:
                kind = req.WhichOneof("request")
                if kind == "chunk":  # data: a view (client/wire/chunks.py) or protobuf's copy
                    validate.write_chunk(
                        req.chunk.lengths, len(req.chunk.data), req.chunk.raw_bytes
                    )
                    write.add_chunk(req.chunk.lengths, req.chunk.data, req.chunk.raw_bytes)
                elif kind == "finish" and req.finish.failed:
                    write.give_up(req.finish.failed)
                    return
                elif kind == "finish":
                    staged = [
                        StagedShard(
                            s.index, s.num_elements, s.num_records, s.stored_bytes, s.raw_bytes
                        )
                        for s in req.finish.staged_shards
                    ]
                    validate.write_finish(staged)
                    record = write.commit(req.finish.num_elements, staged)
                    yield pb.WriteCacheResponse(committed=to_proto(record))
                    return
                else:
                    raise InvalidArgument(f"unexpected {kind!r} request after WriteBegin")

    def _proto(self, record: CacheRecord, shards: bool = True) -> pb.Cache:
        cache = to_proto(record, self.catalog.retention_of(record.name), shards)
        cache.direct_leases, cache.direct_reads = self.leases.counts(record.name)
        if self.catalog.tier is not None and record.state == "READY":
            status = self.catalog.tier.status(record.name)
            cache.store.CopyFrom(
                pb.StoreStatus(
                    state=_STORE_STATES[status.state],
                    done_bytes=status.done_bytes,
                    total_bytes=status.total_bytes,
                    done_shards=status.done_shards,
                    detail=status.detail,
                    requests=status.cost.requests,
                    bytes_in=status.cost.bytes_in,
                    bytes_out=status.cost.bytes_out,
                    resident_shards=status.resident_shards,
                    resident_bytes=status.resident_bytes,
                    streamed_bytes=status.streamed_bytes,
                    resident_reads=status.resident_reads,
                    streamed_reads=status.streamed_reads,
                    window_shards=status.window_shards,
                    window_bytes=status.window_bytes,
                    window_reads=status.window_reads,
                    streamed_direct_reads=status.streamed_direct_reads,
                )
            )
        return cache

    @_translating
    def SetCacheRetention(
        self, request: pb.SetCacheRetentionRequest, context: grpc.ServicerContext
    ) -> pb.SetCacheRetentionResponse:
        pinned = request.pinned if request.HasField("pinned") else None
        ttl = request.ttl_seconds if request.HasField("ttl_seconds") else None
        validate.retention(request.name, ttl)
        self.callers.check(context, Verb.ADMIN, request.name)
        record = self.catalog.set_retention(request.name, pinned, ttl)
        log.info("cache %r: pinned=%s ttl_seconds=%s", request.name, pinned, ttl)
        return pb.SetCacheRetentionResponse(cache=self._proto(record))

    # ------------------------------------------------------------ materialization

    @_translating
    def StartMaterialize(
        self, request: pb.StartMaterializeRequest, context: grpc.ServicerContext
    ) -> pb.StartMaterializeResponse:
        if self._draining.is_set():
            raise ShuttingDown("the daemon is shutting down; retry against its replacement")
        validate.start_materialize(
            request.name, request.entry_point, request.element_spec, request.fingerprint
        )
        starter = self.callers.check(context, Verb.WRITE, request.name)
        snap = self.materializer.start(
            request.name,
            entry_point=request.entry_point,
            graph_def=request.graph_def,
            element_spec=request.element_spec,
            num_shards=request.num_shards,
            workers=request.workers,
            overwrite=request.overwrite,
            resume=request.resume,
            fingerprint=request.fingerprint,
            block_bytes=request.block_bytes if request.HasField("block_bytes") else None,
        )
        self.callers.started(snap.name, starter)
        return pb.StartMaterializeResponse(operation=operation_to_proto(snap))

    @_translating
    def GetOperation(
        self, request: pb.GetOperationRequest, context: grpc.ServicerContext
    ) -> pb.GetOperationResponse:
        self._follow(context, request.name)
        return pb.GetOperationResponse(
            operation=operation_to_proto(self.materializer.get(request.name))
        )

    @_translating
    def WatchOperation(
        self, request: pb.WatchOperationRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.WatchOperationResponse]:
        self._follow(context, request.name)
        validate.watch_interval(request.interval)
        for snap in self.materializer.watch(request.name, request.interval, context.is_active):
            yield pb.WatchOperationResponse(operation=operation_to_proto(snap))

    @_translating
    def CancelOperation(
        self, request: pb.CancelOperationRequest, context: grpc.ServicerContext
    ) -> pb.CancelOperationResponse:
        self._follow(context, request.name)
        return pb.CancelOperationResponse(
            operation=operation_to_proto(self.materializer.cancel(request.name))
        )

    def _follow(self, context: grpc.ServicerContext, operation: str) -> None:
        validate.operation(operation)
        self.callers.check_follow(context, operation)

    @_translating
    def ReadElements(
        self, request: pb.ReadElementsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ReadElementsResponse]:
        validate.read_elements(request.name, request.fingerprint, request.indices)
        self.callers.check(context, Verb.READ, request.name, "ReadElements")
        with reads.reading(self.catalog, request.name, hit=request.epoch_start):
            chunks = reads.read_elements(
                self.catalog,
                request.name,
                request.fingerprint,
                request.indices,
                request.chunk_bytes,
            )
            self._plane_missed(context, request.name)
            for position, lengths, data in chunks:
                metrics.READ_BYTES.labels("grpc").inc(len(data))
                metrics.READ_ELEMENTS.inc(len(lengths) // 4)
                yield pb.ReadElementsResponse(position=position, lengths=lengths, data=data)

    # ------------------------------------------------------------ direct reads

    @_translating
    def AcquireReadLease(
        self, request: pb.AcquireReadLeaseRequest, context: grpc.ServicerContext
    ) -> pb.AcquireReadLeaseResponse:
        validate.read(request.name, request.fingerprint)
        holder = self.callers.check(context, Verb.READ, request.name)
        peer = peer_ip(context.peer()) if request.data_plane and self.data_port else ""
        lease, record, paths = self.leases.acquire(
            request.name,
            request.fingerprint,
            request.epoch_start,
            request.shards,
            peer,
            holder,
            request.pass_shards,
        )
        return pb.AcquireReadLeaseResponse(
            lease_id=lease.id,
            ttl_seconds=self.leases.ttl,
            cache=self._proto(record),
            data_dir=str(self.leases.data_dir),
            shard_dirs=[str(p) for p in paths],
            instance_token=self.leases.token,
            instance_token_path=str(self.leases.token_path),
            ticket=lease.ticket,
            data_port=self.data_port if lease.ticket else 0,
            streamed_shards=lease.streamed,
        )

    def _plane_missed(self, context: grpc.ServicerContext, name: str) -> None:
        """Count (and log once per address) a read over gRPC by a caller holding an unused
        data-plane ticket for the cache: its data connections do not get through."""
        if not self.data_port:
            return
        peer = peer_ip(context.peer())
        if peer and self.leases.fell_back(peer, name):
            metrics.DATA_FALLBACKS.inc()
            if peer not in self._fallback_peers:
                self._fallback_peers.add(peer)
                log.warning(
                    "%s reads cache %r over gRPC: it holds a data-plane ticket but its "
                    "data connections to port %d do not get through; open that port "
                    "to it (docs/operations.md) for reads at the link's rate",
                    peer,
                    name,
                    self.data_port,
                )

    @_translating
    def RenewReadLease(
        self, request: pb.RenewReadLeaseRequest, context: grpc.ServicerContext
    ) -> pb.RenewReadLeaseResponse:
        validate.lease_id(request.lease_id)
        return pb.RenewReadLeaseResponse(ttl_seconds=self.leases.renew(request.lease_id))

    @_translating
    def ReleaseReadLease(
        self, request: pb.ReleaseReadLeaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseReadLeaseResponse:
        validate.lease_id(request.lease_id)
        self.leases.release(request.lease_id)
        return pb.ReleaseReadLeaseResponse()

    @_translating
    def HoldStreamedShard(
        self, request: pb.HoldStreamedShardRequest, context: grpc.ServicerContext
    ) -> pb.HoldStreamedShardResponse:
        validate.lease_id(request.lease_id)
        # the reads it lets the caller make are the lease's: the same grant as taking it
        self.callers.check(context, Verb.READ, self.leases.cache_of(request.lease_id))
        held = self.leases.hold(request.lease_id, request.shard)
        return pb.HoldStreamedShardResponse(
            shard_dir=str(held.path.resolve()), resident=held.resident
        )

    @_translating
    def ReleaseStreamedShard(
        self, request: pb.ReleaseStreamedShardRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseStreamedShardResponse:
        validate.lease_id(request.lease_id)
        self.leases.release_hold(request.lease_id, request.shard, request.read_to_end)
        return pb.ReleaseStreamedShardResponse()

    # ------------------------------------------------------------ readers' figures

    @_translating
    def ReportReads(
        self, request: pb.ReportReadsRequest, context: grpc.ServicerContext
    ) -> pb.ReportReadsResponse:
        readers = validate.report_reads(request.reporter, request.readers)
        for labels, _ in readers:
            self.callers.check(context, Verb.READ, labels.cache)
        if self.report_readers:
            READERS.report(request.reporter, readers)
        return pb.ReportReadsResponse(expiry_seconds=READERS.expiry)
