"""Errors a user can act on: each maps to one client exception with a useful message."""

from __future__ import annotations

import time

import grpc
import pytest
from daemon import free_port

from client import (
    CacheClient,
    CacheNotFoundError,
    InvalidArgumentError,
    ServerUnavailableError,
    ShardcacheError,
)


def test_an_unknown_cache_is_not_found_and_named(cc, name) -> None:
    with pytest.raises(CacheNotFoundError, match=f"cache '{name}' not found"):
        cc.info(name)
    with pytest.raises(CacheNotFoundError, match=name):
        cc.dataset(name)
    with pytest.raises(CacheNotFoundError):
        cc.delete(name)


@pytest.mark.parametrize("bad", ["", "../x", "/abs", "x" * 201, "ctl\x01char", "a/b"])
def test_invalid_names_are_invalid_arguments(cc, bad) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        cc.info(bad)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_an_unreachable_daemon_is_named_within_seconds() -> None:
    target = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with (
        CacheClient(target, connect_timeout=2) as cc,
        pytest.raises(ServerUnavailableError, match=f"cannot reach cacheserver at {target}"),
    ):
        cc.list()
    assert time.monotonic() - start < 10


def test_an_unreachable_daemon_fails_cache_before_any_tensorflow_iteration() -> None:
    tf = pytest.importorskip("tensorflow")
    with (
        CacheClient("unix:///tmp/shardcache-nowhere.sock", connect_timeout=1) as cc,
        pytest.raises(ServerUnavailableError, match=r"shardcache-nowhere\.sock"),
    ):
        cc.cache(tf.data.Dataset.range(3), name="x")


def test_every_client_error_is_a_shardcache_error(cc) -> None:
    with pytest.raises(ShardcacheError):
        cc.info("../bad")


def test_bad_prefetch_budgets_are_rejected(cc, name) -> None:
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(InvalidArgumentError, match="prefetch_bytes"):
        cc.cache(tf.data.Dataset.range(3), name=name, prefetch_bytes=0)


def test_an_infinite_dataset_is_refused_with_advice(cc, name) -> None:
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(InvalidArgumentError, match=r"before \.repeat\(\)"):
        cc.cache(tf.data.Dataset.range(3).repeat(), name=name)
