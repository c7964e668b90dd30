"""Looking a cache up in the object store: a burst of readers costs one GET of its manifest.

A daemon asked for a cache it lacks looks for the cache's manifest in the store
(cacheserver/catalog/lookups.py). However many readers ask at once, the store sees one
GET of the manifest, counted from the S3 server's own access log; a name the store
lacks is looked up again only after LOOKUP_TTL_S, and then a cache published meanwhile
is found; a lookup's error reaches every reader waiting on it and is never kept.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import stores
from s3 import STORE_PREFIX, S3Server
from stores import elements, publish, s3, source, store_daemon
from waits import wait_until

from cacheserver.catalog.lookups import LOOKUP_TTL_S, Lookups
from client import CacheClient, CacheNotFoundError, StoreUnavailableError

READERS = 16
daemons = stores.daemons  # the fixture


def manifest_gets(server: S3Server, store: Any, name: str, status: int | None = None) -> int:
    """GETs of name's manifest in the server's log, once every request made so far is in it
    (the server logs behind its responses: a last GET of a missing key marks the end)."""
    client, bucket, _ = s3(store)
    mark = f"{STORE_PREFIX}/log-mark-{uuid.uuid4().hex}"
    with pytest.raises(client.exceptions.NoSuchKey):
        client.get_object(Bucket=bucket, Key=mark)
    wait_until(
        lambda: mark.split("/", 1)[1] in server.requests("GET", "log-mark-", bucket=bucket),
        10,
        "the mark in the server's log",
    )
    return len(server.requests("GET", f"{name}/manifest.json", bucket=bucket, status=status))


def at_once(target: str, ask: Callable[[CacheClient], Any]) -> list[Any]:
    """READERS clients of their own asking together; what each got (a value or an error)."""
    start = threading.Barrier(READERS)

    def one(_: int) -> Any:
        with CacheClient(target) as cc:
            start.wait(30)
            try:
                return ask(cc)
            except Exception as exc:
                return exc

    with ThreadPoolExecutor(READERS) as pool:
        return list(pool.map(one, range(READERS)))


def move(store: Any, src: str, dst: str) -> None:
    """Rename an object in the store (copy and delete: no GET)."""
    client, bucket, base = s3(store)
    client.copy_object(
        Bucket=bucket, Key=base + dst, CopySource={"Bucket": bucket, "Key": base + src}
    )
    client.delete_object(Bucket=bucket, Key=base + src)


@pytest.mark.slow
def test_readers_asking_at_once_for_a_stored_cache_cost_one_get_of_its_manifest(
    store, moto_server, daemons, name
) -> None:
    pytest.importorskip("tensorflow")
    publish(store, daemons, name)
    before = manifest_gets(moto_server, store, name)
    b = store_daemon(store)
    daemons.append(b)
    got = at_once(b.unix_target, lambda cc: elements(cc.dataset(name, parallel_shards=4)))
    assert all(g == elements(source()) for g in got), [g for g in got if isinstance(g, Exception)]
    assert manifest_gets(moto_server, store, name) - before == 1
    with CacheClient(b.unix_target) as cc:
        shards = cc.info(name).num_shards
    objects = moto_server.requests("GET", f"{name}/objects/")
    assert len(objects) == shards and len(set(objects)) == shards, objects


@pytest.mark.slow
def test_a_name_the_store_lacks_is_looked_up_once_then_again_after_a_few_seconds(
    store, moto_server, daemons, name
) -> None:
    pytest.importorskip("tensorflow")
    publish(store, daemons, name)
    move(store, f"{name}/manifest.json", f"{name}/manifest.aside")  # the store lacks it
    before = manifest_gets(moto_server, store, name)
    b = store_daemon(store)
    daemons.append(b)
    for _ in range(2):  # a second burst, within LOOKUP_TTL_S: the kept answer
        got = at_once(b.unix_target, lambda cc: cc.dataset(name))
        assert all(isinstance(g, CacheNotFoundError) for g in got), got
    assert manifest_gets(moto_server, store, name) - before == 1
    move(store, f"{name}/manifest.aside", f"{name}/manifest.json")  # a publish commits

    def found() -> bool:
        try:
            with CacheClient(b.unix_target) as cc:
                return elements(cc.dataset(name)) == elements(source())
        except CacheNotFoundError:
            return False

    wait_until(found, LOOKUP_TTL_S + 30, "the cache published meanwhile")
    assert manifest_gets(moto_server, store, name) - before == 2
    assert manifest_gets(moto_server, store, name, status=200) == 1


@pytest.mark.slow
def test_a_store_that_cannot_be_reached_fails_every_reader_and_is_asked_again(
    store, moto_server, daemons, name
) -> None:
    b = store_daemon(store)
    daemons.append(b)
    moto_server.stop()
    try:
        got = at_once(b.unix_target, lambda cc: cc.info(name))
        assert all(isinstance(g, StoreUnavailableError) for g in got), got
    finally:
        moto_server.start()
    before = manifest_gets(moto_server, store, name)
    with CacheClient(b.unix_target) as cc, pytest.raises(CacheNotFoundError):
        cc.info(name)  # looked up at once: the error was not kept as "absent"
    assert manifest_gets(moto_server, store, name) - before == 1


def waiters(lookups: Lookups, name: str) -> int:
    """How many callers wait for the lookup of name under way (CPython's Future)."""
    flight = lookups._flights.get(name)
    return 0 if flight is None else len(flight._condition._waiters)  # type: ignore[attr-defined]


def test_callers_waiting_on_a_lookup_share_its_answer_and_its_error() -> None:
    release, fetched = threading.Event(), []
    answers: list[Any] = [ValueError("store down"), None]

    def fetch(name: str) -> None:
        fetched.append(name)
        release.wait(10)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    lookups = Lookups(fetch)

    def ask(_: int) -> Any:
        try:
            return lookups.find("x")
        except ValueError as exc:
            return exc

    for expected in (ValueError, type(None)):  # the error is not kept: asked again
        with ThreadPoolExecutor(8) as pool:
            waiting = [pool.submit(ask, i) for i in range(8)]
            wait_until(
                lambda: len(fetched) == 1 and waiters(lookups, "x") == 7,
                10,
                "one fetch, seven callers waiting for it",
            )
            release.set()
            assert all(isinstance(w.result(), expected) for w in waiting)
        release.clear()
        fetched.clear()
    assert lookups.find("x") is None and fetched == []  # kept


def test_an_answer_is_kept_for_its_ttl_and_forget_drops_it() -> None:
    now, fetched = [0.0], []
    lookups = Lookups(lambda name: fetched.append(name), ttl_s=5, clock=lambda: now[0])
    lookups.find("x")
    now[0] = 4.9
    lookups.find("x")
    assert fetched == ["x"]
    now[0] = 5.1
    lookups.find("x")
    lookups.forget("x")
    lookups.find("x")
    assert fetched == ["x", "x", "x"]
