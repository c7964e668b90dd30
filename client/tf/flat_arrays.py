"""A cache's decoded batches as a numpy_function's flat arrays, and back."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from client.format.codec import VarLeaf

_FIXED, _VAR, _EMPTY = "fixed", "var", "empty"  # convert.BatchFormat.kinds


class FlatArrays:
    """A cache's decoded batches as flat numpy arrays and back, in fmt.signature's form.

    numpy_function returns flat tensors; ``arrays`` flattens a decoded batch
    (codec.decode_batch's form), ``signature_of`` rebuilds fmt.signature's
    structure in TF (variable-shape leaves as the ragged pairs to_wire makes).
    """

    def __init__(self, fmt: Any) -> None:
        self.fmt = fmt
        self.dtypes: list[tf.DType] = []
        self._count = -1  # a flat array with one row per element
        for leaf, kind in zip(fmt.layout.leaves, fmt.kinds):
            dtype = tf.as_dtype(leaf.dtype)
            if kind != _EMPTY and self._count < 0:
                self._count = len(self.dtypes) + (kind == _VAR)  # a fixed leaf, or sizes
            if kind == _FIXED:
                self.dtypes.append(dtype)
            elif kind == _VAR:
                self.dtypes += [dtype, tf.int64, tf.int64, tf.int64]
        self._dummy = not self.dtypes
        #: every leaf has a fixed shape and bytes: a batch is one array per leaf
        self.fixed = not self._dummy and all(kind == _FIXED for kind in fmt.kinds)
        if self._dummy:
            self._count = 0
            self.dtypes.append(tf.uint8)

    def arrays(self, n: int, batch: list[Any]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for kind, leaf in zip(self.fmt.kinds, batch):
            if kind == _FIXED:
                out.append(leaf)
            elif kind == _VAR:
                assert isinstance(leaf, VarLeaf)
                out += [leaf.values, leaf.sizes, leaf.dims, leaf.ranks]
        if self._dummy:
            out.append(np.zeros(n, np.uint8))
        return out

    def batch(self, flat: list[np.ndarray]) -> tuple[int, list[Any]]:
        """arrays()'s inverse: (count, the decoded batch) of a batch's flat arrays."""
        n = len(flat[self._count])
        it = iter(flat)
        batch: list[Any] = []
        for kind, leaf in zip(self.fmt.kinds, self.fmt.layout.leaves):
            if kind == _FIXED:
                batch.append(next(it))
            elif kind == _VAR:
                batch.append(VarLeaf(next(it), next(it), next(it), next(it)))
            else:
                batch.append(np.zeros((n, *leaf.shape), tf.as_dtype(leaf.dtype).as_numpy_dtype))
        return n, batch

    def flat_of(self, batch: Any) -> list[tf.Tensor]:
        """signature_of()'s inverse: the flat tensors of a batch in fmt.signature's form."""
        parts = tf.nest.flatten(batch)
        if self.fmt.direct:
            return parts
        flat: list[tf.Tensor] = []
        for part in parts:
            if isinstance(part, tf.RaggedTensor):
                flat += [part.flat_values, part.row_lengths()]
            else:
                flat.append(part)
        return flat

    def signature_of(self, flat: list[tf.Tensor], lead: int = 1) -> Any:
        """flat's tensors in fmt.signature's structure; lead: the leading dimensions of a
        fixed leaf's array before its element shape (2: several batches of a chunk)."""
        it = iter(flat)
        parts: list[Any] = []

        def shaped(tensor: tf.Tensor, shape: tuple[Any, ...]) -> tf.Tensor:
            tensor.set_shape(shape)  # numpy_function's outputs have none; no op at run time
            return tensor

        for kind, leaf in zip(self.fmt.kinds, self.fmt.layout.leaves):
            if kind == _FIXED:
                parts.append(shaped(next(it), (*(None,) * lead, *leaf.shape)))
            elif kind == _VAR:
                values, sizes, dims, ranks = (shaped(next(it), (None,)) for _ in range(4))
                parts.append(tf.RaggedTensor.from_row_lengths(values, sizes, validate=False))
                parts.append(tf.RaggedTensor.from_row_lengths(dims, ranks, validate=False))
        if self._dummy:
            parts.append(shaped(next(it), (None,)))
        if self.fmt.direct:
            return tf.nest.pack_sequence_as(self.fmt.signature, parts)
        return tuple(parts)
