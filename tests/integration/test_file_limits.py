"""Caches of more shards than a process may open: a daemon under a low fd limit serves them,
and a direct reader under one reads them, every element exactly once; a list of them says
how many shards each has without carrying them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from client import CacheClient
from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc
from tests.daemon import Daemon
from tests.sharded import write_tiny_shards

SHARDS = 300
PER_SHARD = 4
N = SHARDS * PER_SHARD
LIMIT = 128  # file descriptors: well under one per shard
PRLIMIT_READER = ("prlimit", f"--nofile={2 * LIMIT}:{2 * LIMIT}", "--")


class LimitedDaemon(Daemon):
    """A daemon started under prlimit --nofile=LIMIT (prlimit execs it: the pid is its own)."""

    @property
    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={LIMIT}:{LIMIT}", "--", *super().command]


@pytest.fixture(scope="module")
def limited() -> Iterator[Daemon]:
    daemon = LimitedDaemon()
    daemon.start()
    with CacheClient(daemon.unix_target) as cc:
        write_tiny_shards(cc, "many", SHARDS, PER_SHARD)
    yield daemon
    daemon.close()


def _fd_limit(pid: int) -> int:
    line = next(
        x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in x
    )
    return int(line.split()[3])


def test_a_daemon_serves_a_cache_of_more_shards_than_its_file_limit(limited: Daemon) -> None:
    assert limited.proc is not None and _fd_limit(limited.proc.pid) == LIMIT
    with CacheClient(limited.unix_target) as cc:
        in_order = [
            int(x)
            for b in cc.numpy("many", batch_size=64, direct=False, parallel_shards=4)
            for x in b
        ]
        shuffled = [
            int(x)
            for b in cc.numpy("many", batch_size=64, direct=False, shuffle=True, seed=3)
            for x in b
        ]
    assert in_order == list(range(N))
    assert shuffled != in_order and sorted(shuffled) == in_order
    assert len(os.listdir(f"/proc/{limited.proc.pid}/fd")) < LIMIT


_READER = textwrap.dedent(
    """
    import json, sys
    from client import CacheClient
    with CacheClient(sys.argv[1]) as cc:
        runs = {
            order: [
                int(x)
                for b in cc.numpy("many", batch_size=64, direct=True, shuffle=order == "shuffled")
                for x in b
            ]
            for order in ("in order", "shuffled")
        }
    print(json.dumps(runs))
    """
)


def test_a_direct_reader_under_a_low_file_limit_reads_every_shard_of_a_larger_cache(
    limited: Daemon,
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [*PRLIMIT_READER, sys.executable, "-c", _READER, limited.unix_target],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.splitlines()[-1])
    assert runs["in order"] == list(range(N))
    assert runs["shuffled"] != runs["in order"] and sorted(runs["shuffled"]) == list(range(N))


def test_a_list_carries_each_caches_shard_count_and_not_its_shards(limited: Daemon) -> None:
    """The BASIC view (cc.list(), cacheserver ls) stays one line per cache however many
    shards it has; a request without a view, and GetCache, still carry every shard."""
    with grpc.insecure_channel(limited.unix_target) as channel:
        stub = pb_grpc.CacheServiceStub(channel)
        basic = stub.ListCaches(pb.ListCachesRequest(view=pb.CACHE_VIEW_BASIC), timeout=10)
        unset = stub.ListCaches(pb.ListCachesRequest(), timeout=10)
        full = stub.GetCache(pb.GetCacheRequest(name="many"), timeout=10).cache
    [listed] = basic.caches
    assert listed.num_shards == SHARDS and len(listed.shards) == 0
    # what is left is the cache's own fields: no more than a shard's worth per few shards
    overhead = len(listed.layout_json) + len(listed.element_spec) + len(listed.fingerprint)
    assert basic.ByteSize() < overhead + 512 < full.ByteSize()
    assert len(unset.caches[0].shards) == len(full.shards) == full.num_shards == SHARDS
    with CacheClient(limited.unix_target) as cc:
        assert [(c.name, c.num_shards) for c in cc.list()] == [("many", SHARDS)]
    shown = subprocess.run(
        [sys.executable, "-m", "cacheserver", "ls", "--target", limited.unix_target],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert shown[1].split()[:4] == ["many", "READY", f"{N:,}", str(SHARDS)]
