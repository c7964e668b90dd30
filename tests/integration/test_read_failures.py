"""A read that fails says why once, and what it cancels names that cause, not a bare error."""

from __future__ import annotations

import numpy as np
import pytest
from daemon import Daemon

from client import CacheClient, CacheNotFoundError
from client.read.fetching.fetch import Closed
from client.read.opening import open_read
from client.read.planning.plan import ReadOptions


def _write(cc: CacheClient, name: str) -> None:
    rng = np.random.default_rng(0)  # noise: ~4 KB stored per element, many chunks
    cc.write(
        name,
        ({"x": rng.standard_normal(1024).astype(np.float32)} for _ in range(400)),
        block_bytes=0,
    )


def _chunks(cc: CacheClient, name: str) -> object:
    """Epoch 0 of cache name over gRPC (the unix socket has no data plane), in small chunks."""
    read = open_read(
        cc._daemons, None, name, ReadOptions(direct=False, prefetch_bytes=512 << 10), ""
    )
    return read.chunks(0, 0)


def test_requests_cancelled_after_a_read_failed_name_the_failure(daemon: Daemon, name: str) -> None:
    with CacheClient(daemon.unix_target) as cc:
        _write(cc, name)
        chunks = _chunks(cc, name)
        assert chunks.count > 3
        assert chunks.chunk(0)[0] > 0
        cc.delete(name)
        with pytest.raises(CacheNotFoundError, match=f"cache '{name}' not found") as failure:
            chunks.chunk(1)
        chunks.close()  # as the iterator going away does, with requests still asked for
        with pytest.raises(Closed) as cancelled:
            chunks.chunk(2)
        assert str(cancelled.value) == (
            f"the read of cache '{name}' was closed after another of its requests failed: "
            f"{failure.value}; this request was cancelled"
        )


def test_requests_of_a_read_closed_without_a_failure_say_it_was_closed(
    daemon: Daemon, name: str
) -> None:
    with CacheClient(daemon.unix_target) as cc:
        _write(cc, name)
        chunks = _chunks(cc, name)
        chunks.close()
        with pytest.raises(
            Closed,
            match=f"^the read of cache '{name}' was closed \\(its "
            "dataset, iterator or source was closed\\); this request was "
            "cancelled$",
        ):
            chunks.chunk(0)
