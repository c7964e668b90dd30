"""The caching strategies under comparison and the timed epoch loop they share.

Every strategy turns the uncached source pipeline into two epochs. All of them batch with the
same batch size *after* the cache op, so per-batch Python overhead is identical and small, and
the per-element cost of the cache op itself is what differs.

=============  ==========================================================================
strategy       epoch 1 / epoch 2
=============  ==========================================================================
``none``       recompute the source / recompute the source
``memory``     ``ds.cache()`` fill / read from the in-memory cache
``file``       ``ds.cache(filename)`` write / read the cache files
``save_load``  ``Dataset.save`` (timed as epoch 1) / iterate ``Dataset.load``
``save_load_gzip``  the same with ``compression="GZIP"`` (not run unless named)
``shardcache`` ``CacheClient.cache`` write-through to the daemon / read from the daemon
               over gRPC (``direct=False``)
``shardcache_direct``  the same, epoch 2 reading the shard files directly under a read
               lease (``direct=True``, docs/direct.md)
``shardcache_read``  read an existing cache (``cc.dataset``, over gRPC unless
               ``--client-option direct=true``) / read it again (not run unless named;
               bench/scaling.py builds the cache first)
=============  ==========================================================================

``--client-option KEY=VALUE`` (measure.py) passes keyword arguments to ``cc.cache()`` /
``cc.dataset()``, e.g. ``parallel_shards=4``.

These functions run inside the per-strategy measurement subprocess (``measure.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import tensorflow as tf
    from workloads import Workload

STRATEGIES: tuple[str, ...] = ("none", "memory", "file", "save_load", "shardcache",
                               "shardcache_direct")
EXTRA_STRATEGIES: tuple[str, ...] = ("save_load_gzip", "shardcache_read")


class StrategyUnavailableError(Exception):
    """The strategy cannot run in this environment (e.g. the ``client`` package is missing)."""


@dataclass
class EpochResult:
    """Outcome of one timed epoch."""

    seconds: float
    elements: int
    label_sum: int | None  # None when the epoch does not yield elements (Dataset.save)


@dataclass
class StrategyContext:
    """Everything a strategy needs besides the source dataset."""

    workload: Workload
    n: int
    batch_size: int
    tmp_dir: Path
    socket_path: str | None
    cache_name: str
    client_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """Two epochs ready to run, plus objects that must stay alive until both have run."""

    epochs: tuple[Callable[[], EpochResult], Callable[[], EpochResult]]
    keep_alive: list[object] = field(default_factory=list)


def timed_iteration(ds: tf.data.Dataset) -> EpochResult:
    """Iterate ``ds`` (a batched dataset) fully and time it.

    The clock covers iterator creation and the loop, and stops *before* the iterator is
    destroyed: tearing down a tf.data iterator (autotune, prefetch threads) can stall for
    seconds, which is not part of producing the data. Each batch is touched by reading its
    labels, which also yields an order-independent checksum.
    """
    start = time.perf_counter()
    iterator = iter(ds)
    elements = 0
    label_sum = 0
    for _features, labels in iterator:
        elements += int(labels.shape[0])
        label_sum += int(labels.numpy().sum())
    seconds = time.perf_counter() - start
    del iterator
    return EpochResult(seconds=seconds, elements=elements, label_sum=label_sum)


def _same_dataset_twice(ds: tf.data.Dataset) -> Plan:
    """Plan that iterates one dataset object twice (the cache lives in that object)."""
    return Plan(epochs=(lambda: timed_iteration(ds), lambda: timed_iteration(ds)))


def plan_none(src: tf.data.Dataset, ctx: StrategyContext) -> Plan:
    """No cache: both epochs recompute every element."""
    return _same_dataset_twice(src.batch(ctx.batch_size))


def plan_memory(src: tf.data.Dataset, ctx: StrategyContext) -> Plan:
    """``ds.cache()``: epoch 1 fills the in-memory cache, epoch 2 reads it."""
    return _same_dataset_twice(src.cache().batch(ctx.batch_size))


def plan_file(src: tf.data.Dataset, ctx: StrategyContext) -> Plan:
    """``ds.cache(filename)``: epoch 1 writes cache files in the temp dir, epoch 2 reads them."""
    cache_dir = ctx.tmp_dir / "file_cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    return _same_dataset_twice(src.cache(str(cache_dir / "cache")).batch(ctx.batch_size))


def plan_save_load(src: tf.data.Dataset, ctx: StrategyContext,
                   compression: str | None = None) -> Plan:
    """``Dataset.save`` once (epoch 1), then iterate ``Dataset.load`` (epoch 2)."""
    import tensorflow as tf

    path = str(ctx.tmp_dir / "saved")

    def save() -> EpochResult:
        start = time.perf_counter()
        src.save(path, compression=compression)
        return EpochResult(seconds=time.perf_counter() - start, elements=ctx.n, label_sum=None)

    def load() -> EpochResult:
        return timed_iteration(
            tf.data.Dataset.load(path, compression=compression).batch(ctx.batch_size))

    return Plan(epochs=(save, load))


def plan_save_load_gzip(src: tf.data.Dataset, ctx: StrategyContext) -> Plan:
    """``Dataset.save(compression="GZIP")``, then ``Dataset.load`` of it."""
    return plan_save_load(src, ctx, compression="GZIP")


def _client(ctx: StrategyContext) -> Any:
    """A CacheClient on the runner's daemon, or StrategyUnavailableError saying why not."""
    try:
        from client import CacheClient
    except Exception as exc:  # any import-time failure means "not available here"
        raise StrategyUnavailableError(
            f"import client failed: {type(exc).__name__}: {exc}"
        ) from exc
    if ctx.socket_path is None:
        raise StrategyUnavailableError("no cacheserver daemon socket was provided")
    return CacheClient("unix://" + ctx.socket_path)


def _plan_client(cc: Any, ds: tf.data.Dataset) -> Plan:
    plan = _same_dataset_twice(ds)
    plan.keep_alive.append(cc)
    return plan


def plan_shardcache(src: tf.data.Dataset, ctx: StrategyContext, direct: bool = False) -> Plan:
    """``CacheClient.cache``: epoch 1 writes through to the daemon, epoch 2 reads from it
    (over gRPC, or with direct the shard files themselves)."""
    cc = _client(ctx)
    options = {"direct": direct, **ctx.client_options}
    return _plan_client(cc, cc.cache(src, name=ctx.cache_name, **options).batch(ctx.batch_size))


def plan_shardcache_direct(src: tf.data.Dataset, ctx: StrategyContext) -> Plan:
    """``CacheClient.cache(direct=True)``: epoch 2 reads the leased shard files locally."""
    return plan_shardcache(src, ctx, direct=True)


def plan_shardcache_read(src: tf.data.Dataset, ctx: StrategyContext) -> Plan:
    """``CacheClient.dataset``: both epochs read an existing cache named ``ctx.cache_name``."""
    del src  # the cache was built beforehand (bench/scaling.py); the source is not needed
    cc = _client(ctx)
    options = {"direct": False, **ctx.client_options}
    return _plan_client(cc, cc.dataset(ctx.cache_name, **options).batch(ctx.batch_size))


PLANNERS: dict[str, Callable[[tf.data.Dataset, StrategyContext], Plan]] = {
    "none": plan_none,
    "memory": plan_memory,
    "file": plan_file,
    "save_load": plan_save_load,
    "save_load_gzip": plan_save_load_gzip,
    "shardcache": plan_shardcache,
    "shardcache_direct": plan_shardcache_direct,
    "shardcache_read": plan_shardcache_read,
}
