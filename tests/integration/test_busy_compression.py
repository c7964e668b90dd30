"""SHARDCACHE_COMPRESS=spare-cpu: a write epoch compresses only while CPU is spare
(client/write/spare_cpu.py).

Every CPU this process may use is kept busy for real, by spinning processes, while
cc.cache() writes compressible images: with spare-cpu their records are stored raw, by
default zstd-compressed; both read back exactly.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from test_block_caches import photo_like  # noqa: E402

from client import CacheClient  # noqa: E402
from client.errors import InvalidArgumentError  # noqa: E402

N = 480
SIDE = 128  # 48 KiB images: a slice of ~4 MiB, one compress-or-not decision, per 85


@pytest.fixture
def busy_cpus() -> Iterator[None]:
    """One spinning process per CPU this process may run on, for the test's duration."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in os.sched_getaffinity(0)
    ]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def _source(images: np.ndarray) -> tf.data.Dataset:
    """The images through a map that costs CPU, as a preprocessing pipeline does."""

    def work(x: tf.Tensor, i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        m = tf.random.stateless_uniform([96, 96], seed=tf.stack([i, i]))
        for _ in range(8):
            m = tf.linalg.matmul(m, m) / 96.0
        return x + tf.cast(tf.reduce_sum(m) * 0, tf.uint8), i

    return tf.data.Dataset.from_tensor_slices((images, np.arange(len(images)))).map(
        work, num_parallel_calls=tf.data.AUTOTUNE
    )


def _write_and_check(cc: CacheClient, name: str, images: np.ndarray) -> float:
    """Write the cache through one epoch, read it back; its raw/stored ratio."""
    ds = cc.cache(_source(images), name=name)
    for _ in range(2):  # the write epoch, then a read of what it stored
        got = []
        for x, i in ds.as_numpy_iterator():
            np.testing.assert_array_equal(x, images[i])
            got.append(int(i))
        assert got == list(range(N))
    info = cc.info(name)
    return info.raw_bytes / info.stored_bytes


def test_spare_cpu_with_every_core_busy_stores_a_write_epochs_records_raw(
    daemon, cc: CacheClient, name: str, busy_cpus: None, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDCACHE_COMPRESS", "spare-cpu")
    images = photo_like(N, SIDE)
    with caplog.at_level(logging.INFO, logger="client"):
        ratio = _write_and_check(cc, name, images)
    said = re.search(r"(\d+) of (\d+) elements stored uncompressed", caplog.text)
    assert said, caplog.text
    raw, total = map(int, said.groups())
    assert total == N and raw >= N // 2, said.group(0)  # the first window may compress
    assert ratio < 1.4, ratio  # compressed, these images take 1.8x less


def test_by_default_a_write_epoch_compresses_with_every_core_busy(
    daemon, cc: CacheClient, name: str, busy_cpus: None, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDCACHE_COMPRESS", raising=False)
    images = photo_like(N, SIDE)
    with caplog.at_level(logging.INFO, logger="client"):
        assert _write_and_check(cc, name, images) > 1.8
    assert "stored uncompressed" not in caplog.text


def test_an_unknown_compress_mode_is_refused_when_the_dataset_is_made(
    cc: CacheClient, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDCACHE_COMPRESS", "sometimes")
    with pytest.raises(InvalidArgumentError, match=r"SHARDCACHE_COMPRESS='sometimes'.*spare-cpu"):
        cc.cache(tf.data.Dataset.range(3), name=name)
