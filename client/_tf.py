"""The TensorFlow adapter: the only client module that imports tensorflow.

Elements are flattened with ``expand_composites=True`` into dense leaves
(RaggedTensor -> values + row splits, SparseTensor -> indices, values, shape).
The generator behind ``from_generator`` yields one *batch* per call: fixed-shape
leaves as stacked arrays, variable-shape leaves as a ragged pair (flat values,
dims); ``unbatch`` splits them in C++, and only when needed a map rebuilds
variable shapes and composites. Leaves whose fixed shape holds zero items are
not sent at all (``unbatch`` crashes TF 2.21 on zero-size components): the map
creates them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import struct_pb2
from tensorflow.python.saved_model import nested_structure_coder

from client.codec import Layout, Leaf, VarLeaf
from client.errors import InvalidArgumentError

_FIXED, _VAR, _EMPTY = "fixed", "var", "empty"


def layout_of(spec: Any) -> Layout:
    """The record layout of a dataset's element_spec."""
    leaves = []
    for component in tf.nest.flatten(spec, expand_composites=True):
        if not isinstance(component, tf.TensorSpec):
            raise InvalidArgumentError(f"cannot cache component {component!r}: only tensors, "
                                       "RaggedTensor and SparseTensor are supported")
        shape = None if component.shape.rank is None else tuple(component.shape.as_list())
        try:
            leaves.append(Leaf(component.dtype.name, shape))
        except ValueError as exc:
            raise InvalidArgumentError(f"cannot cache component {component!r}: {exc}") from exc
    return Layout(tuple(leaves))


def encode_spec(spec: Any) -> bytes:
    return nested_structure_coder.encode_structure(spec).SerializeToString()


def decode_spec(data: bytes) -> Any:
    value = struct_pb2.StructuredValue()
    value.ParseFromString(data)
    return nested_structure_coder.decode_proto(value)


def fingerprint_of(dataset: tf.data.Dataset, version: str | None) -> str:
    """What produced the cache: the user's version, or a hash of the dataset graph.

    tf.data's own graph hash ignores function names, so the same pipeline
    built in another process gets the same fingerprint. It cannot see inside
    py_function or generator code: pass version= to key on those.
    """
    if version is not None:
        return f"version:{version}"
    graph = int(tf.raw_ops.DatasetFingerprint(input_dataset=dataset._variant_tensor))
    spec = hashlib.sha256(encode_spec(dataset.element_spec)).hexdigest()[:16]
    return f"graph:{graph:016x}-{spec}"


class WireFormat:
    """How one cache's batches travel through from_generator and back to elements."""

    def __init__(self, spec: Any, layout: Layout) -> None:
        self.spec = spec
        self.layout = layout
        self._kinds = [
            _EMPTY if leaf.fixed and leaf.size == 0 else _FIXED if leaf.fixed else _VAR
            for leaf in layout.leaves
        ]
        composite = any(isinstance(s, tf.TypeSpec) and not isinstance(s, tf.TensorSpec)
                        for s in tf.nest.flatten(spec))
        self.direct = not composite and bool(self._kinds) and all(k == _FIXED for k in self._kinds)
        if self.direct:  # the generator yields the element structure itself, batched
            self.signature = tf.nest.map_structure(
                lambda s: tf.TensorSpec((None, *s.shape), s.dtype), spec)
            return
        sig: list[Any] = []
        for leaf, kind in zip(layout.leaves, self._kinds):
            dtype = tf.as_dtype(leaf.dtype)
            if kind == _FIXED:
                sig.append(tf.TensorSpec((None, *leaf.shape), dtype))  # type: ignore[misc]
            elif kind == _VAR:
                sig.append(tf.RaggedTensorSpec((None, None), dtype, 1, tf.int64))
                sig.append(tf.RaggedTensorSpec((None, None), tf.int64, 1, tf.int64))
        self._dummy = not sig
        if self._dummy:  # unbatch needs one component to count elements
            sig.append(tf.TensorSpec((None,), tf.uint8))
        self.signature = tuple(sig)

    @property
    def batchable_source(self) -> bool:
        """True when the source can be read with .batch() (fixed dense leaves only)."""
        return self.direct

    def to_wire(self, batch: list[Any], n: int) -> Any:
        """Turn a decoded batch (codec.decode_batch output) into a generator yield."""
        if self.direct:
            return tf.nest.pack_sequence_as(self.signature, batch)
        out: list[Any] = []
        for kind, leaf in zip(self._kinds, batch):
            if kind == _FIXED:
                out.append(leaf)
            elif kind == _VAR:
                assert isinstance(leaf, VarLeaf)
                out.append(tf.RaggedTensor.from_row_lengths(leaf.values, leaf.sizes,
                                                            validate=False))
                out.append(tf.RaggedTensor.from_row_lengths(leaf.dims, leaf.ranks,
                                                            validate=False))
        if self._dummy:
            out.append(np.zeros(n, np.uint8))
        return tuple(out)

    def _assemble(self, *wire: Any) -> Any:
        it = iter(wire)
        leaves = []
        for kind, leaf in zip(self._kinds, self.layout.leaves):
            dtype = tf.as_dtype(leaf.dtype)
            if kind == _FIXED:
                leaves.append(next(it))
            elif kind == _EMPTY:
                leaves.append(tf.zeros(leaf.shape, dtype))
            else:
                values, dims = next(it), next(it)
                tensor = tf.reshape(values, dims)
                if leaf.shape is not None:
                    tensor = tf.ensure_shape(tensor, leaf.shape)
                leaves.append(tensor)
        return tf.nest.pack_sequence_as(self.spec, leaves, expand_composites=True)

    def dataset(self, batches: Callable[[], Iterator[Any]], cardinality: int) -> tf.data.Dataset:
        """A dataset over the batches a fresh call of batches() yields, one per epoch."""
        ds = tf.data.Dataset.from_generator(batches, output_signature=self.signature).unbatch()
        if not self.direct:
            ds = ds.map(self._assemble, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if cardinality >= 0:
            ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
        return ds


def source_batches(dataset: tf.data.Dataset, wire: WireFormat,
                   batch_elements: int) -> Iterator[tuple[list[np.ndarray] | None, list[Any]]]:
    """Iterate a source pipeline for write-through.

    Yields (batched leaves, None) when the source can be batched in TF, else
    (None, per-element leaf lists) for up to batch_elements elements.
    """
    if wire.batchable_source:
        for batch in dataset.batch(batch_elements):
            yield [t.numpy() for t in tf.nest.flatten(batch)], []
        return
    pending: list[Any] = []
    for element in dataset:
        pending.append([t.numpy() for t in tf.nest.flatten(element, expand_composites=True)])
        if len(pending) >= batch_elements:
            yield None, pending
            pending = []
    if pending:
        yield None, pending


def cardinality_of(dataset: tf.data.Dataset) -> int:
    return int(dataset.cardinality())


INFINITE = int(tf.data.INFINITE_CARDINALITY)
