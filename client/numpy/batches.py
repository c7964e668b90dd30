"""Elements and batches of NumPy arrays from decoded chunks, in the stored structure.

A decoded chunk (client/read/assembly/decode.py) holds one column per layout leaf: a
stacked array for a fixed-shape leaf (strings: an object array of bytes), a
:class:`VarLeaf` for a variable-shape one. :class:`Columns` turns chunks into
the element structure (client/format/spec.py) one element at a time, or cuts
batches of a given size across chunk boundaries: fixed-shape leaves as slices
(views into the chunk's arrays) or one concatenation where a batch spans two
chunks, variable-shape leaves as a list of one array per element.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from client.errors import InvalidArgumentError
from client.format import spec
from client.format.codec import VarLeaf
from client.format.layout import Layout

#: One leaf's elements in a chunk: a stacked array, or a list of arrays (variable shapes).
Column = Any


def format_of(name: str, element_spec: bytes, layout: Layout) -> Any:
    """The structure of a cache's elements (spec.decode), checked against its layout;
    InvalidArgumentError naming what a NumPy reader cannot give."""
    try:
        structure = spec.decode(element_spec)
    except ValueError as exc:
        raise InvalidArgumentError(
            f"cache {name!r}: {exc}; read it with cc.dataset() in TensorFlow"
        ) from exc
    leaves = spec.flatten(structure)
    for path, leaf in leaves:
        if isinstance(leaf, spec.Composite):
            raise InvalidArgumentError(
                f"cache {name!r}: element component {path} is a {leaf.kind}, which has no "
                "NumPy form here; read it with cc.dataset() in TensorFlow, or cache it as "
                "dense tensors (e.g. .to_tensor(), or values and row lengths)"
            )
    if len(leaves) != len(layout.leaves):
        raise InvalidArgumentError(
            f"cache {name!r}: its element spec has {len(leaves)} components and its layout "
            f"{len(layout.leaves)}; the cache is damaged: build it again"
        )
    return structure


def _column(leaf: Any) -> Column:
    return leaf.split() if isinstance(leaf, VarLeaf) else leaf


def _take(column: Column, lo: int, hi: int) -> Column:
    return column[lo:hi]


def _join(parts: list[Column]) -> Column:
    if len(parts) == 1:  # the last batch, of one chunk: its slice, no copy
        return parts[0]
    if isinstance(parts[0], list):
        return [x for part in parts for x in part]
    return np.concatenate(parts)


class Columns:
    """Chunks of one cache as elements or batches of its structure."""

    def __init__(self, structure: Any) -> None:
        self._pack = spec.packer(structure)

    def elements(self, chunks: Iterable[tuple[int, list[Any]]]) -> Iterator[Any]:
        """Every element of chunks, in order."""
        pack = self._pack
        for n, batch in chunks:
            columns = [_column(leaf) for leaf in batch]
            if not columns:  # an element of no leaves
                yield from (pack(()) for _ in range(n))
                continue
            for row in zip(*columns):
                yield pack(row)

    def batches(
        self, chunks: Iterable[tuple[int, list[Any]]], size: int, drop_remainder: bool
    ) -> Iterator[tuple[int, Any]]:
        """(count, batch) of size elements each, the last one shorter unless dropped."""
        pack = self._pack
        held: list[tuple[int, list[Column]]] = []  # a partial batch's pieces
        have = 0
        for n, batch in chunks:
            columns = [_column(leaf) for leaf in batch]
            at = 0
            if have:  # complete the partial batch first
                take = min(size - have, n)
                held.append((take, [_take(c, 0, take) for c in columns]))
                have, at = have + take, take
                if have < size:
                    continue
                yield size, pack(tuple(_join([p[k] for _, p in held]) for k in range(len(columns))))
                held, have = [], 0
            while n - at >= size:
                yield size, pack(tuple(_take(c, at, at + size) for c in columns))
                at += size
            if at < n:
                held.append((n - at, [_take(c, at, n) for c in columns]))
                have = n - at
        if have and not drop_remainder:
            width = len(held[0][1])
            yield have, pack(tuple(_join([p[k] for _, p in held]) for k in range(width)))
