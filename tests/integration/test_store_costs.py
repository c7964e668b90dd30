"""What the object store is asked, counted by the daemon: requests by kind, bytes by direction.

One cache published by one daemon (a build) and read by a second that never saw it (a cold
read), over a real moto server; the daemons' counts are checked against moto's own access
log, request by request, and the figures docs/operations.md gives are these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from daemon import Daemon, free_port
from exposition import scrape
from stores import elements, publish, source, store_daemon

from client import CacheClient

pytestmark = pytest.mark.slow
tf = pytest.importorskip("tensorflow")


def logged(moto_server: Any, bucket: str, name: str) -> Counter[str]:
    """Requests for name's keys in moto's access log, by kind as the daemon counts them."""
    kinds: Counter[str] = Counter()
    for r in moto_server.access_log():
        if r.bucket != bucket:
            continue
        key_is_ours = r.key.startswith(f"tier/{name}/")
        lists_ours = not r.key and f"prefix=tier%2F{name}%2F" in r.query
        if not (key_is_ours or lists_ours or ("delete" in r.query and not r.key)):
            continue
        kinds[
            {
                "GET": "LIST" if lists_ours else "GET",
                "POST": "DELETE" if "delete" in r.query else "PUT",
            }.get(r.method, r.method)
        ] += 1
    return kinds


@pytest.fixture(scope="module")
def built(moto_server: Any) -> Iterator[tuple[Any, Daemon, Daemon, str]]:
    """One cache published by daemon a, then read once on daemon b (metrics on b)."""
    store = moto_server.start().store()
    name = "costed"
    started: list[Daemon] = []
    port = free_port()
    try:
        a = publish(store, started, name)
        b = store_daemon(store, "--metrics-listen", f"127.0.0.1:{port}")
        b.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        started.append(b)
        with CacheClient(b.unix_target) as cc:
            assert elements(cc.dataset(name)) == elements(source())
        yield store, a, b, name
    finally:
        for d in started:
            d.close()


def test_a_build_costs_one_put_per_shard_and_one_for_the_manifest(built) -> None:
    _, a, _, name = built
    with CacheClient(a.unix_target) as cc:
        info = cc.info(name)
    # the writer's first calls look for the name in the store (GETs answered 404: one per
    # LOOKUP_TTL_S, so one or two here)
    assert set(info.store_requests) == {"GET", "PUT"} and info.store_requests["GET"] <= 2
    assert info.store_requests["PUT"] == info.num_shards + 1
    # the shard objects, and the manifest
    assert info.store_total_bytes < info.store_bytes_out < info.store_total_bytes + (64 << 10)
    assert info.store_bytes_in < 4096  # the 404's answer


def test_a_cold_read_costs_one_get_per_shard_and_one_for_the_manifest(built) -> None:
    _, a, b, name = built
    with CacheClient(a.unix_target) as ca, CacheClient(b.unix_target) as cb:
        sent, info = ca.info(name), cb.info(name)
    assert info.store_requests == {"GET": info.num_shards + 1}
    # every object and the manifest a sent, fetched once each
    assert info.store_bytes_in == sent.store_bytes_out and info.store_bytes_out == 0


def test_the_counts_are_what_the_store_logged(built, moto_server) -> None:
    store, a, b, name = built
    bucket = store.url.removeprefix("s3://").partition("/")[0]
    with CacheClient(a.unix_target) as ca, CacheClient(b.unix_target) as cb:
        ours = Counter(ca.info(name).store_requests) + Counter(cb.info(name).store_requests)
    assert ours == logged(moto_server, bucket, name)


def test_the_daemon_exports_its_totals_by_kind_and_direction(built) -> None:
    _, _, b, name = built
    got = scrape(b.metrics_url)
    with CacheClient(b.unix_target) as cc:
        info = cc.info(name)
    by_op = {
        op: got[("shardcache_store_requests_total", (("op", op),))]
        for op in ("GET", "PUT", "HEAD", "LIST", "DELETE")
    }
    # the daemon's own HEAD of the bucket at startup is no cache's
    assert by_op == {"GET": info.num_shards + 1, "PUT": 0, "HEAD": 1, "LIST": 0, "DELETE": 0}
    assert got[("shardcache_store_bytes_total", (("direction", "in"),))] == info.store_bytes_in
    assert got[("shardcache_store_bytes_total", (("direction", "out"),))] == 0
