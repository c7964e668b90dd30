"""CacheClient's readers and writer for NumPy, Grain and PyTorch: no TensorFlow.

client/_client.py's CacheClient inherits them; the work is client/numpy/'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client._daemons import CacheInfo, Daemons
from client.errors import InvalidArgumentError
from client.format.blocks import check_block_bytes
from client.read.fetching import direct as direct_read
from client.read.planning import plan

if TYPE_CHECKING:
    from client.numpy.reader import ArrayReader
    from client.numpy.source import CacheSource
    from client.numpy.torch import CacheIterable


class ArrayMethods:
    """cc.numpy(), cc.source(), cc.torch() and cc.write() (docs/frameworks.md)."""

    _daemons: Daemons
    _local_data_dir: Path | None

    def _reopener(self) -> Callable[[], tuple[Daemons, Path | None]]:
        raise NotImplementedError

    def numpy(
        self,
        name: str,
        *,
        batch_size: int | None = None,
        drop_remainder: bool = False,
        prefetch_bytes: int = plan.DEFAULT_PREFETCH_BYTES,
        shuffle: bool | str = False,
        seed: int | None = None,
        worker_index: int = 0,
        num_workers: int = 1,
        parallel_shards: int = 0,
        epoch: int = 0,
        start: int = 0,
        resume: plan.Resume = None,
        reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
        direct: bool | str | None = None,
    ) -> ArrayReader:
        """A READY cache's elements as NumPy arrays, without TensorFlow: an iterable whose
        every iter() reads the next epoch, as cc.dataset()'s iterations do.

        Elements come in the stored structure (dicts, tuples, named tuples) of
        NumPy arrays; strings as bytes (object arrays of bytes). batch_size=B
        yields batches of B elements instead (the last shorter unless
        drop_remainder), fixed-shape components stacked, variable-shape ones a
        list of one array per element. The read options are cc.dataset()'s, with
        the same orders, shares and resume (parallel_shards: chunks in flight; 0:
        as many as prefetch_bytes holds, at most 16). reader.state() is the
        ReadState after the elements handed out so far: cc.numpy() and
        cc.dataset() both take it as resume=. See docs/frameworks.md.
        """
        from client.numpy.reader import ArrayReader

        return ArrayReader(self._daemons, self._local_data_dir, name, plan.ReadOptions.of(locals()))

    def source(
        self,
        name: str,
        *,
        direct: bool | str | None = None,
        reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
    ) -> CacheSource:
        """A READY cache as a random-access data source: len(), source[i] (the element at
        index i of the stored order, as cc.numpy() yields it) and a batched fetch of a list
        of indices in one request (__getitems__; Grain's _getitems). It is Grain's
        RandomAccessDataSource and a PyTorch map-style Dataset: their samplers, sharding and
        worker processes apply. Picklable: each process connects on its first read, to the
        daemon(s) this client connects to. See docs/frameworks.md.
        """
        from client.numpy.source import CacheSource

        options = plan.ReadOptions.of(locals())
        cache = self._daemons.ready(name, "call source() again")
        return CacheSource(name, self._reopener(), options, cache.num_elements)

    def torch(
        self,
        name: str,
        *,
        batch_size: int | None = None,
        drop_remainder: bool = False,
        prefetch_bytes: int = plan.DEFAULT_PREFETCH_BYTES,
        shuffle: bool | str = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        parallel_shards: int = 0,
        epoch: int = 0,
        reconnect_timeout: float = plan.DEFAULT_RECONNECT_TIMEOUT,
        direct: bool | str | None = None,
    ) -> CacheIterable:
        """A READY cache as a PyTorch IterableDataset of tensors (needs torch; no TensorFlow).

        Each iteration reads one epoch through cc.numpy()'s reader, as the share of
        worker rank * W + worker_id of world_size * W, W the DataLoader's workers;
        rank and world_size default to torch.distributed's. set_epoch(e) as with
        DistributedSampler; state_dict()/load_state_dict() resume mid-epoch (in
        each worker under torchdata's StatefulDataLoader). batch_size and the
        other options are cc.numpy()'s. Spawn the workers. See docs/frameworks.md.
        """
        from client.numpy.torch import CacheIterable

        if (rank is None) != (world_size is None):
            raise InvalidArgumentError(
                "give rank and world_size together, or neither (then torch.distributed's are used)"
            )
        worker_index, num_workers = rank or 0, world_size or 1
        options = plan.ReadOptions.of(locals())
        self._daemons.ready(name, "call torch() again")
        placement = None if rank is None or world_size is None else (rank, world_size)
        return CacheIterable(name, self._reopener(), options, placement)

    def write(
        self,
        name: str,
        elements: Iterable[Any],
        *,
        version: str | None = None,
        block_bytes: int | None = None,
        direct: bool | str | None = None,
    ) -> CacheInfo:
        """Build READY cache name from an iterable of nested NumPy structures, without
        TensorFlow; returns its CacheInfo.

        Each element is a dict (str keys), tuple or named tuple of arrays, scalars
        or bytes (strings), nested as deep as needed, every element of one
        structure and dtype. The stored element spec (what cc.dataset() in
        TensorFlow yields) takes each component's dtype from the first element
        and its shape from the first 1024: a dimension that differs among them
        is stored as unknown (None). Lists are stored as tuples. version= keys
        the cache as cc.cache() does: a READY cache of that name and version is
        returned as it is, without iterating elements; without version= an
        existing cache of that name raises CacheExistsError. block_bytes and
        direct: as cc.cache(). See docs/frameworks.md.
        """
        from client.numpy import writer

        if version is not None and not isinstance(version, str):
            raise InvalidArgumentError(f"version must be a str or None, got {version!r}")
        if isinstance(elements, (str, bytes, Mapping)) or not isinstance(elements, Iterable):
            raise InvalidArgumentError(
                f"elements must be an iterable of elements, got {type(elements).__name__}"
            )
        mode = direct_read.resolve_mode(direct)
        return CacheInfo.from_proto(
            writer.write(
                self._daemons,
                name,
                elements,
                version,
                check_block_bytes(block_bytes),
                mode,
                self._local_data_dir,
            )
        )
