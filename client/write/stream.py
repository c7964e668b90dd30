"""The write side of write-through: one WriteCache stream holding the lease."""

from __future__ import annotations

import contextlib
import queue
import struct
from collections.abc import Iterator, Sequence

import grpc

from client._transport import Transport, pb
from client.errors import ShardcacheError, from_rpc_error
from client.wire.chunks import encode_chunk_request, serialize_request
from client.wire.limits import DEFAULT_CHUNK_BYTES

_WRITE_CACHE = "/cacheserver.v1.CacheService/WriteCache"
_SEND_QUEUE = 4


class CacheWriter:
    """Sends records to the daemon in ~1 MiB chunks; finish() commits, abort() discards.

    Use begin() first: it returns the daemon's decision; only ACCEPTED writers
    may add records.
    """

    def __init__(
        self, transport: Transport, begin: pb.WriteBegin, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        self._transport = transport
        self._begin = begin
        self._chunk_bytes = chunk_bytes
        # requests, or chunks already serialized (client/wire/chunks.py)
        self._requests: queue.Queue[pb.WriteCacheRequest | bytes | None] = queue.Queue(_SEND_QUEUE)
        self._lengths: list[int] = []
        self._data: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._raw_bytes = 0
        self.num_elements = 0
        self._call: grpc.Call | None = None
        self._responses: Iterator[pb.WriteCacheResponse] | None = None

    def _request_stream(self) -> Iterator[pb.WriteCacheRequest | bytes]:
        yield pb.WriteCacheRequest(begin=self._begin)
        while (req := self._requests.get()) is not None:
            yield req

    def _fail(self, err: grpc.RpcError) -> ShardcacheError:
        return from_rpc_error(err, self._transport.target)

    def begin(self) -> pb.WriteBegun:
        self._transport.connect()
        write_cache = self._transport.channel.stream_stream(
            _WRITE_CACHE,
            request_serializer=serialize_request,
            response_deserializer=pb.WriteCacheResponse.FromString,
        )
        call = write_cache(self._request_stream())
        self._call = self._responses = call
        try:
            return next(call).begun
        except grpc.RpcError as err:
            raise self._fail(err) from err

    def _send(self, request: pb.WriteCacheRequest | bytes) -> None:
        assert self._call is not None
        while True:
            try:
                self._requests.put(request, timeout=0.25)
                return
            except queue.Full:
                self._check_stream()

    def _check_stream(self) -> None:
        """Raise why, once the daemon has ended the stream (it died, restarted, refused)."""
        assert self._call is not None
        if self._call.done():
            try:
                next(self._responses)  # type: ignore[arg-type]
            except grpc.RpcError as err:
                raise self._fail(err) from err
            except StopIteration:
                pass
            raise ShardcacheError("the daemon closed the write stream early") from None

    def _end_requests(self) -> None:
        """Mark the end of the request stream.

        Once the call is over nothing reads the queue, so a full one would keep
        a plain put() waiting forever (a disk that filled near the end of a
        write hung the epoch so); the responses then say why the call ended.
        """
        assert self._call is not None
        while not self._call.done():
            with contextlib.suppress(queue.Full):
                self._requests.put(None, timeout=0.25)
                return

    def add(
        self, values: Sequence[bytes | memoryview], raw_bytes: int, num_elements: int | None = None
    ) -> None:
        """Queue values (num_elements elements; default one per value) for sending."""
        for v in values:
            self._lengths.append(len(v))
            self._pending_bytes += len(v)
        self._data.extend(values)
        self._raw_bytes += raw_bytes
        self.num_elements += len(values) if num_elements is None else num_elements
        if self._pending_bytes >= self._chunk_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._lengths:
            return
        request = encode_chunk_request(
            struct.pack(f"<{len(self._lengths)}I", *self._lengths), self._data, self._raw_bytes
        )
        self._lengths, self._data, self._pending_bytes, self._raw_bytes = [], [], 0, 0
        self._send(request)

    def finish(self) -> pb.Cache:
        """Commit: returns the READY cache."""
        self._flush()
        self._send(pb.WriteCacheRequest(finish=self._finish_message()))
        self._end_requests()
        try:
            for response in self._responses:  # type: ignore[union-attr]
                if response.HasField("committed"):
                    return response.committed
        except grpc.RpcError as err:
            raise self._fail(err) from err
        raise ShardcacheError("the daemon ended the write stream without committing")

    def _finish_message(self) -> pb.WriteFinish:
        return pb.WriteFinish(num_elements=self.num_elements)

    def abort(self) -> None:
        """Cancel the stream: the daemon discards everything written so far."""
        if self._call is not None and not self._call.done():
            self._call.cancel()
        # Wake gRPC's request thread if it waits for our next request; a full
        # queue means it is not waiting.
        with contextlib.suppress(queue.Full):
            self._requests.put_nowait(None)
