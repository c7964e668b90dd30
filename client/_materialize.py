"""Server-side materialization from the client: start, watch, wait, cancel.

The daemon runs the pipeline (see cacheserver/materialize/materializer.py); this module
starts the operation, follows its WatchOperation stream and shows progress:
a tqdm bar on a terminal, else a log line every few seconds.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from client._transport import Transport, pb
from client.errors import (
    _BY_CODE,
    _BY_REASON,
    InvalidArgumentError,
    ShardcacheError,
    from_rpc_error,
)
from client.format.blocks import check_block_bytes

log = logging.getLogger("client")
_STATES = {
    pb.OPERATION_STATE_RUNNING: "RUNNING",
    pb.OPERATION_STATE_SUCCEEDED: "SUCCEEDED",
    pb.OPERATION_STATE_FAILED: "FAILED",
    pb.OPERATION_STATE_CANCELLED: "CANCELLED",
}
_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Seconds between progress lines when stderr is not a terminal.
LOG_EVERY = 10.0


@dataclass(frozen=True)
class Progress:
    """One snapshot of a materialization operation."""

    name: str
    cache: str
    state: str  # RUNNING | SUCCEEDED | FAILED | CANCELLED
    done: bool
    shards_total: int
    shards_done: int
    shards_resumed: int
    elements: int
    raw_bytes: int
    stored_bytes: int
    bytes_per_second: float
    elements_per_second: float
    eta_seconds: float  # negative: not known yet
    workers: int
    shard_errors: tuple[str, ...]
    error: str

    @classmethod
    def from_proto(cls, op: pb.Operation) -> Progress:
        return cls(
            op.name,
            op.cache,
            _STATES.get(op.state, "UNSPECIFIED"),
            op.done,
            op.shards_total,
            op.shards_done,
            op.shards_resumed,
            op.elements,
            op.raw_bytes,
            op.stored_bytes,
            op.bytes_per_second,
            op.elements_per_second,
            op.eta_seconds,
            op.workers,
            tuple(e.message for e in op.shard_errors),
            op.error.message,
        )

    def line(self) -> str:
        """'31/64 shards  812,204 elements  38.1 GiB  412.0 MiB/s  ETA 4m12s'."""
        eta = "ETA ?" if self.eta_seconds < 0 else f"ETA {_duration(self.eta_seconds)}"
        return (
            f"{self.shards_done}/{self.shards_total} shards  {self.elements:,} elements  "
            f"{_size(self.stored_bytes)}  {_size(self.bytes_per_second)}/s  {eta}"
        )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def operation_error(op: pb.Operation) -> ShardcacheError:
    """The client exception for a failed or cancelled operation."""
    err = op.error
    code = _CODES.get(err.code, grpc.StatusCode.UNKNOWN)
    cls = _BY_REASON.get(err.reason) or _BY_CODE.get(code, ShardcacheError)
    return cls(err.message or f"{op.name} {_STATES.get(op.state, 'failed')}")


def _terminal_size() -> tuple[int, int]:
    """(columns, lines) of stderr's terminal; a pty nobody sized reports 0x0: then 100x24.

    tqdm hides a bar that falls below the terminal's last line, so 0 lines
    would hide it.
    """
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return 100, 24
    return size.columns or 100, size.lines or 24


class ProgressDisplay:
    """A tqdm bar over shards when stderr is a terminal; else periodic log lines."""

    def __init__(self, emit: Callable[[str], None] | None = None, enabled: bool = True) -> None:
        self._emit = emit or log.info
        self._enabled = enabled
        self._bar: Any = None
        self._last = 0.0
        self._tty = enabled and sys.stderr.isatty()

    def update(self, p: Progress) -> None:
        if not self._enabled:
            return
        if self._tty:
            if self._bar is None:
                from tqdm import tqdm

                columns, lines = _terminal_size()
                self._bar = tqdm(
                    total=p.shards_total,
                    unit="shard",
                    file=sys.stderr,
                    desc=p.cache,
                    ncols=columns,
                    nrows=lines,
                )
            self._bar.n = p.shards_done
            self._bar.set_postfix_str(p.line().split("shards  ", 1)[-1], refresh=True)
            return
        now = time.monotonic()
        if p.done or now - self._last >= LOG_EVERY:
            self._last = now
            self._emit(f"{p.name}: {p.state.lower()}  {p.line()}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class MaterializeOperation:
    """A handle on a materialization running in the daemon."""

    def __init__(self, transport: Transport, op: pb.Operation) -> None:
        self._transport = transport
        self.name = op.name
        self.cache = op.cache
        self._last = op

    def __repr__(self) -> str:
        return f"MaterializeOperation({self.name!r})"

    def progress(self) -> Progress:
        """The operation's state now (one GetOperation call)."""
        stub = self._transport.stub
        self._last = self._transport.call(
            stub.GetOperation, pb.GetOperationRequest(name=self.name)
        ).operation
        return Progress.from_proto(self._last)

    def cancel(self) -> Progress:
        """Stop the operation: its workers stop and its unfinished cache is discarded."""
        stub = self._transport.stub
        self._last = self._transport.call(
            stub.CancelOperation, pb.CancelOperationRequest(name=self.name)
        ).operation
        return Progress.from_proto(self._last)

    def wait(
        self,
        timeout: float | None = None,
        *,
        show_progress: bool = False,
        emit: Callable[[str], None] | None = None,
    ) -> Progress:
        """Block until the operation is done; raise its error if it did not succeed.

        Raises TimeoutError after timeout seconds (the operation keeps running).
        """
        display = ProgressDisplay(emit, enabled=show_progress)
        self._transport.connect()
        stream = self._transport.stub.WatchOperation(
            pb.WatchOperationRequest(name=self.name, interval=0.5), timeout=timeout
        )
        try:
            for response in stream:
                self._last = response.operation
                display.update(Progress.from_proto(self._last))
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{self.name} still running after {timeout:g}s") from None
            raise from_rpc_error(err, self._transport.target) from err
        finally:
            stream.cancel()
            display.close()
        if not self._last.done:
            raise ShardcacheError(
                f"the daemon stopped reporting on {self.name} before it "
                "finished; resume it with resume=True"
            )
        if self._last.state != pb.OPERATION_STATE_SUCCEEDED:
            raise operation_error(self._last)
        return Progress.from_proto(self._last)


def start(
    transport: Transport,
    source: Any,
    *,
    name: str,
    num_shards: int,
    workers: int | None,
    overwrite: bool,
    resume: bool,
    block_bytes: int | None = None,
) -> MaterializeOperation:
    """Start (or, with resume, attach to) the materialization of source as cache name."""
    if not isinstance(num_shards, int) or isinstance(num_shards, bool):
        raise InvalidArgumentError(f"num_shards must be an int, got {num_shards!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise InvalidArgumentError(f"workers must be a positive int or None, got {workers!r}")
    request = pb.StartMaterializeRequest(
        name=name,
        num_shards=max(num_shards, 0),
        workers=workers or 0,
        overwrite=overwrite,
        resume=resume,
    )
    if num_shards < 1:
        raise InvalidArgumentError(f"num_shards is {num_shards}; it must be at least 1")
    if block_bytes is not None:
        request.block_bytes = check_block_bytes(block_bytes)
    if isinstance(source, str):
        request.entry_point = source
    else:
        from client.tf import convert, graphs

        if not convert.is_dataset(source):
            raise InvalidArgumentError(
                f"cannot materialize a {type(source).__name__}: pass an entry point "
                "'package.module:fn' or a tf.data.Dataset"
            )
        request.graph_def, request.element_spec = graphs.serialize_dataset(source)
        request.fingerprint = graphs.fingerprint_of(source, None)
    stub = transport.stub
    op = transport.call(stub.StartMaterialize, request).operation
    return MaterializeOperation(transport, op)
