"""The dataset cc.cache() and cc.dataset() return, and its batch() without unbatch.

The generator behind a cache's dataset yields decoded batches (blocks of
elements); ``unbatch`` splits them into elements, and the consumer's
``batch(B)`` copies the elements into batches again: two copies of every byte.
``CachedElements`` is that element dataset, unchanged for every other use, but
its ``batch()`` builds ``rebatch(B)`` on the decoded batches instead, which
tf.data documents as "functionally equivalent to unbatch().batch(N), but more
efficient, performing one copy instead of two": the same batches, in the same
order, with the same ``element_spec`` and cardinality. Measured in one process,
alternating: 8-9% faster epochs on 1 KB and 602 KB elements.
A cc.cache() dataset whose source is tapped (client/tf/tap.py) builds its
``batch(B)`` from the source's own ``batch(B)`` on a write epoch (no copy
added) and from ``rebatch(B)`` on a read epoch.

Only caches whose leaves all have a fixed shape get it (their generator yields
the element structure itself, batched); the others (variable shapes, ragged,
sparse) keep a map after ``unbatch``, and their ``batch()`` is tf.data's. A
batch size that is not a Python integer also goes to tf.data's ``batch()``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.util import structure


def declared(ds: tf.data.Dataset, n: int) -> tf.data.Dataset:
    """ds with its cardinality n declared: len(), Keras and distribution see n.

    tf.data's ``assert_cardinality`` checks the count at the end and, when ds
    fell short (a source error lost a batch), raises again on every later call:
    a loop that catches the error and asks again, ``ignore_errors()`` among them,
    never ends. Here ``take(n)`` declares it, over ds followed by an empty
    dataset of infinite cardinality: a short ds just ends (the error that cost
    the elements was raised once), and ``take`` stops at the n-th element without
    asking ds for more. An empty ds has nothing to lose and keeps the assertion.
    """
    if n == 0:
        return ds.apply(tf.data.experimental.assert_cardinality(0))

    @tf.autograph.experimental.do_not_convert
    def never(_: tf.Tensor) -> tf.Tensor:
        return tf.constant(False)

    @tf.autograph.experimental.do_not_convert
    def none_of_ds(_: tf.Tensor) -> tf.data.Dataset:
        return ds.take(0)

    nothing = tf.data.Dataset.from_tensors(np.int64(0)).filter(never).flat_map(none_of_ds)
    return ds.concatenate(nothing.repeat()).take(n)


def with_spec(ds: tf.data.Dataset, spec: Any) -> tf.data.Dataset:
    """ds, declaring the source's element_spec exactly.

    unbatch and map drop TensorSpec names (from_generator's output_signature
    keeps them); the elements are the source's, so its spec describes them.
    """
    if ds.element_spec == spec:
        return ds
    ours = tf.nest.flatten(ds.element_spec, expand_composites=True)
    theirs = tf.nest.flatten(spec, expand_composites=True)
    restructure = getattr(dataset_ops, "_RestructuredDataset", None)
    if (
        restructure is None
        or len(ours) != len(theirs)
        or not all(a.is_compatible_with(b) for a, b in zip(ours, theirs))
    ):
        return ds
    if _carried(ds.element_spec) != _carried(spec):  # a ragged_rank 0 RaggedTensorSpec

        @tf.autograph.experimental.do_not_convert
        def encode(*element: Any) -> tuple[tf.Tensor, ...]:
            components = tf.nest.flatten(element, expand_composites=True)
            value = tf.nest.pack_sequence_as(spec, components, expand_composites=True)
            return tuple(structure.to_tensor_list(spec, value))

        ds = ds.map(encode)
    return restructure(ds, spec)


def _carried(spec: Any) -> list[tf.DType]:
    """The dtypes tf.data carries an element of spec as. A RaggedTensorSpec of ragged_rank 0
    (rows sliced from a ragged tensor) has dense values but is carried as a variant."""
    return [s.dtype for s in structure.get_flat_tensor_specs(spec)]


#: Builds the batches of batch(size, drop_remainder), before their spec is declared.
BatchBuilder = Callable[[int, bool], tf.data.Dataset]


#: Builds the dataset again over source.ignore_errors(log_warning).
IgnoringBuilder = Callable[[bool], tf.data.Dataset]


class CachedElements(dataset_ops.UnaryUnchangedStructureDataset):
    """A cache's elements (``elements``), batched without ``unbatch`` by ``batched``.

    ``elements`` is the unbatched form (cardinality declared, spec declared)
    that iterating this dataset runs; ``batched(size, drop_remainder)``, when
    given, builds the batches: ``rebatch`` on the generator's decoded batches,
    or a tapped write epoch's batches of the source (client/tf/tap.py).
    ``cardinality`` is the element count, or < 0 when unknown. ``ignoring``,
    when given, builds the dataset again over the source's ``ignore_errors()``
    (a tapped cc.cache(): see ignore_errors()).
    """

    def __init__(
        self,
        elements: tf.data.Dataset,
        batched: BatchBuilder | None,
        cardinality: int,
        ignoring: IgnoringBuilder | None = None,
    ) -> None:
        self._batched = batched
        self._elements_cardinality = cardinality
        self._ignoring = ignoring
        super().__init__(elements, elements._variant_tensor)

    def ignore_errors(self, log_warning: bool = False, name: str | None = None) -> tf.data.Dataset:
        """tf.data's ignore_errors(), applied to a write epoch's source element by element.

        The write epoch reads its source in batches, and a source error loses the
        batch that held it (README, "Differences from ds.cache()"); ignoring the
        errors of the source itself, before it is batched, loses only the
        elements that raised, as ``ds.cache().ignore_errors()`` does. A write
        epoch whose source raised is not committed (the tap counts fewer
        elements than the source's cardinality), so every epoch runs the source
        until one runs clean. The cache's own errors (daemon unreachable past
        the reconnect timeout) still raise.
        """
        if self._ignoring is None:
            return super().ignore_errors(log_warning, name)
        return self._ignoring(log_warning)

    def batch(
        self,
        batch_size: Any,
        drop_remainder: bool = False,
        num_parallel_calls: Any = None,
        deterministic: Any = None,
        name: str | None = None,
    ) -> tf.data.Dataset:
        """tf.data's batch(), built on the cache's batches without unbatching them.

        num_parallel_calls and deterministic have nothing to do here: rebatch
        copies each element once, in order, on the iterator's thread, and a
        write epoch batches the source itself.
        """
        if (
            self._batched is None
            or isinstance(batch_size, bool)
            or not isinstance(batch_size, numbers.Integral)
            or batch_size < 1
            or not isinstance(drop_remainder, bool)
        ):
            return super().batch(
                batch_size, drop_remainder, num_parallel_calls, deterministic, name
            )
        size = int(batch_size)
        ds = self._batched(size, drop_remainder)
        n = self._elements_cardinality
        if n >= 0:
            ds = declared(ds, n // size if drop_remainder else -(-n // size))
        first = size if drop_remainder else None
        spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec((first, *s.shape), s.dtype, s.name), self.element_spec
        )
        return with_spec(ds, spec)
