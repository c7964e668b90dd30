"""Daemons over an object store, for the store tests: start one, publish a cache through it.

A store is the ``(url, endpoint, env)`` triple of tests/s3.py's ``Store``; the caches are
float32 noise with their index, ``N`` elements in about 8 shards of 768 KiB.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon import Daemon
from sharded import write_sharded
from waits import wait_until

from client import CacheClient

N, DIM = 3000, 512  # 6 MB of float32 noise: about 8 shards of 768 KiB


def source(n: int = N, seed: int = 0) -> Any:
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, DIM)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((data, np.arange(n)))


def elements(ds: Any) -> list[tuple[bytes, int]]:
    return [(x.numpy().tobytes(), int(i)) for x, i in ds]


def store_daemon(store: Any, *args: str, data_dir: Path | None = None) -> Daemon:
    url, endpoint, env = store
    d = Daemon(
        data_dir, ("--store", url, "--store-endpoint", endpoint, *args), env={**os.environ, **env}
    )
    return d.start()


def s3(store: Any) -> tuple[Any, str, str]:
    """A boto3 client for store, its bucket, and the key prefix of its URL."""
    import boto3

    url, endpoint, env = store
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    return client, bucket, f"{prefix}/" if prefix else ""


def wait_for(cc: CacheClient, name: str, state: str, timeout: float = 60.0) -> Any:
    """cc.info(name) once the store holds name in state."""

    def now() -> str:
        info = cc.info(name)
        return f"{name} {state} (it is {info.store_state}: {info.store_detail})"

    wait_until(lambda: cc.info(name).store_state == state, timeout, now)
    return cc.info(name)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """The daemons a test starts (it appends them), closed after it."""
    started: list[Daemon] = []
    yield started
    for d in started:
        d.close()


def publish(
    store: Any, daemons: list[Daemon], name: str, shard_bytes: int = 768 << 10, n: int = N
) -> Daemon:
    """Write cache name on a new daemon over store and wait until the store holds it."""
    a = store_daemon(store)
    daemons.append(a)
    with CacheClient(a.unix_target) as cc:
        write_sharded(cc, source(n), name, shard_bytes=shard_bytes, chunk_bytes=64 << 10)
        wait_for(cc, name, "STORED")
    return a
