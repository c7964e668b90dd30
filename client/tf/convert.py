"""The TensorFlow adapter: with datasets.py and graphs.py, the only client modules
importing tensorflow (others import them lazily, when a dataset is made).

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

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import struct_pb2
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.saved_model import nested_structure_coder

from client.errors import InvalidArgumentError
from client.format.codec import VarLeaf
from client.format.layout import Layout, Leaf
from client.read.planning.shares import Batches
from client.tf.datasets import with_spec
from client.tf.reads import Transform
from client.tf.tap import READ, SOURCE, WRITE

_FIXED, _VAR, _EMPTY = "fixed", "var", "empty"


def layout_of(spec: Any) -> Layout:
    """The record layout of a dataset's element_spec."""
    leaves = []
    for component in tf.nest.flatten(spec, expand_composites=True):
        if not isinstance(component, tf.TensorSpec):
            raise InvalidArgumentError(
                f"cannot cache component {component!r}: only tensors, "
                "RaggedTensor and SparseTensor are supported"
            )
        shape = None if component.shape.rank is None else tuple(component.shape.as_list())
        try:
            leaves.append(Leaf(component.dtype.name, shape))
        except ValueError as exc:
            raise InvalidArgumentError(f"cannot cache component {component!r}: {exc}") from exc
    return Layout(tuple(leaves))


def encode_spec(spec: Any) -> bytes:
    return nested_structure_coder.encode_structure(spec).SerializeToString(deterministic=True)


def decode_spec(data: bytes) -> Any:
    value = struct_pb2.StructuredValue()
    value.ParseFromString(data)
    return nested_structure_coder.decode_proto(value)


class BatchFormat:
    """How one cache's batches travel through from_generator and back to elements."""

    def __init__(self, spec: Any, layout: Layout) -> None:
        self.spec = spec
        self.layout = layout
        self._kinds = [
            _EMPTY if leaf.fixed and leaf.size == 0 else _FIXED if leaf.fixed else _VAR
            for leaf in layout.leaves
        ]
        composite = any(
            isinstance(s, tf.TypeSpec) and not isinstance(s, tf.TensorSpec)
            for s in tf.nest.flatten(spec)
        )
        self.direct = not composite and bool(self._kinds) and all(k == _FIXED for k in self._kinds)
        if self.direct:  # the generator yields the element structure itself, batched
            self.signature = tf.nest.map_structure(
                lambda s: tf.TensorSpec((None, *s.shape), s.dtype), spec
            )
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
    def kinds(self) -> list[str]:
        """Per leaf: "fixed", "var" or "empty" (fixed shape holding zero items)."""
        return self._kinds

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
                out.append(
                    tf.RaggedTensor.from_row_lengths(leaf.values, leaf.sizes, validate=False)
                )
                out.append(tf.RaggedTensor.from_row_lengths(leaf.dims, leaf.ranks, validate=False))
        if self._dummy:
            out.append(np.zeros(n, np.uint8))
        return tuple(out)

    @tf.autograph.experimental.do_not_convert  # plain Python over the structure
    def _assemble(self, *fmt: Any) -> Any:
        it = iter(fmt)
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

    def unbatched(self, generated: tf.data.Dataset) -> tf.data.Dataset:
        """The elements of generated, a dataset of batches in the wire form (spec undeclared)."""
        ds = generated.unbatch()
        if not self.direct:
            ds = ds.map(self._assemble, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds


#: Batches the source computes ahead of the write-through generator, which spends
#: time between two of its calls handing batches over (docs/writing.md).
SOURCE_PREFETCH_BATCHES = 2


def source_batches(
    dataset: tf.data.Dataset, fmt: BatchFormat, batch_elements: int
) -> Iterator[tuple[int, list[Any]]]:
    """Iterate a source pipeline for write-through, batched in TF.

    Yields (n, batch) with batch in codec.decode_batch's form: a stacked array
    per fixed-shape leaf, a VarLeaf per variable-shape one. Variable-shape
    leaves (and the components of composites) are flattened to 1-D plus their
    shape inside TF, then ragged_batch'ed: one TF call per batch, never one
    per element.
    """
    if fmt.batchable_source:
        for batch in dataset.batch(batch_elements).prefetch(SOURCE_PREFETCH_BATCHES):
            arrays = [_view(t) for t in tf.nest.flatten(batch)]
            yield len(arrays[0]), arrays
        return
    kinds = fmt.kinds
    for batch in _flat_batches(dataset, kinds, batch_elements).prefetch(SOURCE_PREFETCH_BATCHES):
        n = int(batch[0].nrows() if isinstance(batch[0], tf.RaggedTensor) else batch[0].shape[0])
        parts = iter(batch)
        leaves: list[Any] = []
        for kind in kinds:
            if kind == _VAR:
                values, sizes = _rows(next(parts), n)
                dims, ranks = _rows(next(parts), n)
                leaves.append(VarLeaf(values, sizes, dims, ranks))
            else:
                leaves.append(next(parts).numpy())
        yield n, leaves


def _flat_batches(dataset: tf.data.Dataset, kinds: list[str], size: int) -> tf.data.Dataset:
    """Batches of size elements, each variable-shape leaf as its 1-D values plus its shape.

    ragged_batch'ed: the values of a variable-shape leaf (and its shapes, when
    their rank varies) come as RaggedTensors, the rest dense; leaves of zero
    size stay (a dummy counts the elements when nothing else would).
    """

    @tf.autograph.experimental.do_not_convert  # plain Python over the structure
    def flatten(*args: Any) -> tuple[Any, ...]:
        element = args[0] if len(args) == 1 else args  # map unpacks plain tuples only
        out: list[Any] = []
        for tensor, kind in zip(tf.nest.flatten(element, expand_composites=True), kinds):
            if kind == _VAR:
                out += [tf.reshape(tensor, [-1]), tf.shape(tensor, out_type=tf.int64)]
            else:
                out.append(tensor)
        if not out:  # nothing but zero-size leaves: count elements with a dummy
            out.append(tf.zeros((), tf.uint8))
        return tuple(out)

    return dataset.map(flatten).ragged_batch(size)


def _wire_batches(
    source: tf.data.Dataset, fmt: BatchFormat, size: int, drop_remainder: bool = False
) -> tf.data.Dataset:
    """The source's batches of size elements in fmt's wire form (fmt.signature).

    Fixed-shape dense sources are source.batch(); the others are flattened
    and ragged_batch'ed (_flat_batches) and put in the form to_wire gives a
    decoded batch: zero-size leaves dropped, each variable-shape leaf a ragged
    pair (values, dims).
    """
    if fmt.direct:
        return source.batch(size, drop_remainder=drop_remainder)
    kinds = fmt.kinds

    def ragged(t: Any) -> tf.RaggedTensor:
        return t if isinstance(t, tf.RaggedTensor) else tf.RaggedTensor.from_tensor(t)

    @tf.autograph.experimental.do_not_convert  # plain Python over the structure
    def to_wire(*parts: Any) -> tuple[Any, ...]:
        it = iter(parts)
        out: list[Any] = []
        for kind in kinds:
            if kind == _VAR:
                out += [ragged(next(it)), ragged(next(it))]
            elif kind == _FIXED:
                out.append(next(it))
            else:
                next(it)
        if len(out) < len(fmt.signature):  # the dummy that counts the elements
            n = tf.shape(parts[0], out_type=tf.int64)[0]
            out.append(tf.zeros(tf.reshape(n, [1]), tf.uint8))
        return tuple(out)

    return _flat_batches(source, kinds, size).map(to_wire)


def tapped_batches(
    source: tf.data.Dataset,
    fmt: BatchFormat,
    epochs: Any,
    iterations: Any,
    size: int,
    drop_remainder: bool = False,
    batched_reads: bool = True,
    per_iteration: Transform = lambda batches: batches,
) -> tf.data.Dataset:
    """Batches of size elements of cc.cache()'s dataset, the source kept in tf.data.

    client/tf/tap.py has the design. epochs is a tap.TapEpochs; source must be
    of known cardinality. iterations (client/tf/iterations.py) runs epochs' control
    generator, one (token, mode) per iteration, in a checkpointable control, and
    reads the READ branch; take(0) never starts the branches the mode does not
    pick. An iterator saved in a WRITE or SOURCE branch restores into an uncached
    run of the source from the saved position (Iterations). A
    write taps every batch of the source, the short last one included, and
    drop_remainder drops that one only after the tap. A read epoch reads the
    batches themselves (reads.Reader.batches); batched_reads=False leaves a
    read's decoded chunks as they come (for ``unbatch``), and
    per_iteration transforms them inside each iteration (reads.elements).
    """
    batched = _finalized(_wire_batches(source, fmt, size))
    dropped = (
        _finalized(_wire_batches(source, fmt, size, drop_remainder=True))
        if drop_remainder
        else batched
    )
    flat = iterations.reader.flat

    def tapped(hold: np.ndarray, token: np.int64, *flat: np.ndarray) -> np.int32:
        if iterations.live(hold):  # a restored iteration's batches pass through: no write
            epochs.tap(token, *flat)
        return np.int32(0)

    def branch(
        hold: tf.Tensor, token: tf.Tensor, mode: tf.Tensor, epoch: tf.Tensor, start: tf.Tensor
    ) -> tf.data.Dataset:
        def tap(*args: Any) -> Any:  # map unpacks a tuple into args
            batch = tf.nest.pack_sequence_as(fmt.signature, tf.nest.flatten(args))
            # Stateless, so that tf.data saves the iteration (a restored one passes its
            # batches through): its 0 goes into the first leaf's shape, a reshape that
            # copies nothing, for TensorFlow prunes a stateless op only ordered by control.
            done = tf.numpy_function(
                tapped, [hold, token, *flat.flat_of(batch)], tf.int32, stateful=False
            )
            leaves = tf.nest.flatten(batch, expand_composites=True)
            leaves[0] = tf.reshape(leaves[0], tf.shape(leaves[0]) + done)
            return tf.nest.pack_sequence_as(batch, leaves, expand_composites=True)

        def full(*args: Any) -> tf.Tensor:
            return tf.equal(tf.shape(tf.nest.flatten(args)[0], out_type=tf.int64)[0], size)

        def tapped_ahead(ds: tf.data.Dataset) -> tf.data.Dataset:
            """ds's batches, each once the next is tapped, the last one never.

            With drop_remainder the consumer's last batch is the last full one,
            and the declared cardinality (datasets.declared) stops there: the
            short one after it must be tapped (and the write committed) first. An
            empty batch ends ds, so the last real batch comes out too.
            """
            end = tf.data.Dataset.from_tensors(
                tf.nest.map_structure(lambda s: tf.zeros((0, *s.shape[1:]), s.dtype), fmt.signature)
            )
            held = tf.nest.map_structure(
                lambda s: tf.zeros((0, *s.shape[1:]), s.dtype), fmt.signature
            )
            return (
                ds.concatenate(with_spec(end, ds.element_spec))
                .scan((held, False), lambda state, batch: ((batch, True), state))
                .filter(lambda batch, had: had)
                .map(lambda batch, _: batch)
            )

        def only(ds: tf.data.Dataset, picked: tf.Tensor) -> tf.data.Dataset:
            ds = with_spec(ds, fmt.signature)  # concatenate wants the same names
            return ds.take(tf.where(picked, np.int64(-1), np.int64(0)))

        written = batched.map(tap)
        if drop_remainder:
            written = tapped_ahead(written).filter(full)
        reads = iterations.reader.batches(
            epoch,
            start,
            batches=Batches(size, drop_remainder) if batched_reads else None,
            wanted=tf.equal(mode, READ),
        )
        return (
            only(written, tf.equal(mode, WRITE))
            .concatenate(only(dropped, tf.equal(mode, SOURCE)))
            .concatenate(only(reads, tf.equal(mode, READ)))
        )

    iterations.controlled_by(epochs.control)
    return iterations.dataset(branch, per_iteration)


def _finalized(ds: tf.data.Dataset) -> tf.data.Dataset:
    """ds with its options applied as an iterator over ds itself would apply them.

    tf.data applies options (static optimizations such as map and batch
    fusion, autotuning) to the dataset an iterator is made from, not to the
    datasets a flat_map's function returns: a tapped source without this ran
    its map and its batch apart, ~10% more CPU on 1 KB elements (docs/writing.md).
    """
    variant = tf.raw_ops.FinalizeDataset(
        input_dataset=ds._variant_tensor, output_types=ds._flat_types, output_shapes=ds._flat_shapes
    )
    return dataset_ops._VariantDataset(variant, ds.element_spec)


def _view(tensor: tf.Tensor) -> np.ndarray:
    """A tensor's values without copying them: a read-only view of its buffer.

    ``numpy()`` copies (TF 2.21 documents it: tensors are immutable) into a
    16-byte aligned array, which ``from_generator`` then copies again into an
    aligned tensor; ``memoryview`` is zero-copy on CPU and keeps the tensor
    alive. On 602 KB `jpeg` elements that is ~0.3 CPU s and ~90,000 page
    faults less per 600 elements of the write-through epoch (docs/writing.md).
    Strings, and dtypes the buffer protocol cannot describe, are copied.
    """
    if tensor.dtype != tf.string:
        try:
            return np.asarray(memoryview(tensor))
        except (TypeError, ValueError, BufferError):
            pass
    return tensor.numpy()


def _rows(batch: tf.Tensor | tf.RaggedTensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A ragged_batch'ed 1-D component as (concatenated values, length of each row).

    ragged_batch keeps a component dense when every row has the same static
    length (a shape vector of known rank, a flattened (0, None) tensor).
    """
    if isinstance(batch, tf.RaggedTensor):
        return batch.flat_values.numpy(), batch.row_lengths().numpy()
    dense = batch.numpy()
    return dense.reshape(-1), np.full(n, dense.shape[1], np.int64)


def cardinality_of(dataset: tf.data.Dataset) -> int:
    return int(dataset.cardinality())


INFINITE = int(tf.data.INFINITE_CARDINALITY)


def is_dataset(value: Any) -> bool:
    return isinstance(value, tf.data.Dataset)
