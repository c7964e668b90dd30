"""cc.write(): a cache built from an iterable of nested NumPy structures, no TensorFlow.

The element spec comes from the elements: the structure (dicts, tuples, named
tuples; lists are stored as tuples, as tf.data makes them) and each component's
dtype from the first element, each component's shape from the first
``SPEC_ELEMENTS`` elements (up to ``SPEC_BYTES``): a dimension that differs
among them is stored as unknown (None), like a variable-shape tensor. It is
encoded as TensorFlow's own element_spec bytes (client/format/spec.py), so
cc.dataset() in TensorFlow reads the cache with that spec, and its records by
the write path cc.cache() uses (client/format/blocks.py's BlockPacker, the
WriteCache stream or a direct write). A later element that does not fit the
spec ends the write with an error naming the element and the component.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from client._daemons import Daemons
from client._transport import pb
from client.errors import CacheExistsError, CacheNotFoundError, InvalidArgumentError
from client.format import spec
from client.format.blocks import BlockPacker, blocked, write_batch_elements
from client.format.layout import Layout, Leaf
from client.read.fetching import direct as direct_read
from client.write import direct as direct_write

#: The first elements (at most this many, and SPEC_BYTES) whose shapes make the spec.
SPEC_ELEMENTS = 1024
SPEC_BYTES = 64 << 20
_KINDS = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}


def infer(head: list[Any]) -> Any:
    """The spec structure of elements whose first ones are head: dtypes of the first, each
    dimension None where head's elements differ in it."""
    structure = _structure(head[0])
    for i, element in enumerate(head[1:], 1):
        try:
            structure = _general(structure, _structure(element))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"element {i} differs from element 0: {exc}; make "
                "every element of one structure and dtype"
            ) from exc
    return structure


def _structure(element: Any, path: str = "") -> Any:
    """The spec structure of one element, each component a Leaf of its own shape."""
    if isinstance(element, dict):
        for k in element:
            if not isinstance(k, str):
                raise InvalidArgumentError(
                    f"element component {path or 'the element'} has key {k!r}; a cache's "
                    "dicts have str keys"
                )
        return {k: _structure(v, f"{path}[{k!r}]") for k, v in element.items()}
    if isinstance(element, tuple) and hasattr(element, "_fields"):  # a named tuple
        return spec.Named(
            type(element).__name__,
            tuple((k, _structure(v, f"{path}.{k}")) for k, v in zip(element._fields, element)),
        )
    if isinstance(element, (tuple, list)):
        return tuple(_structure(v, f"{path}[{i}]") for i, v in enumerate(element))
    arr = _array(element, path)
    try:
        return Leaf(_dtype_name(arr, path), arr.shape)
    except ValueError as exc:
        raise InvalidArgumentError(f"element component {path or 'the element'}: {exc}") from exc


def _dtype_name(arr: np.ndarray, path: str) -> str:
    if arr.dtype == object or arr.dtype.kind in "SU":
        return "string"
    if arr.dtype.name == "bfloat16":
        return "bfloat16"
    if arr.dtype.kind in _KINDS:
        bits = arr.dtype.itemsize * 8
        return "bool" if arr.dtype.kind == "b" else f"{_KINDS[arr.dtype.kind]}{bits}"
    raise InvalidArgumentError(
        f"element component {path or 'the element'} has dtype {arr.dtype}, which a cache "
        "cannot hold: use bool, (u)int8-64, float16/32/64, bfloat16, complex64/128, or bytes "
        "(str) for strings"
    )


def _array(value: Any, path: str) -> np.ndarray:
    if isinstance(value, (bytes, str)):
        out = np.empty((), object)
        out[()] = value
        return out
    arr = np.asarray(value)
    if arr.dtype.kind in "SU":  # bytes items, as the codec stores them
        arr = arr.astype(object)
    return arr


def _general(a: Any, b: Any, path: str = "") -> Any:
    """One structure covering a and b: their dimensions, None where they differ."""
    if isinstance(a, Leaf):
        if (
            not isinstance(b, Leaf)
            or a.dtype != b.dtype
            or len(a.shape or ()) != len(b.shape or ())
        ):
            raise _misfit(path or "the element", a, b)
        return Leaf(
            a.dtype, tuple(x if x == y else None for x, y in zip(a.shape or (), b.shape or ()))
        )
    if isinstance(a, dict):
        if not isinstance(b, dict) or sorted(a) != sorted(b):
            raise _misfit(path or "the element", a, b)
        return {k: _general(a[k], b[k], f"{path}[{k!r}]") for k in a}
    if isinstance(a, spec.Named):
        if not isinstance(b, spec.Named) or [k for k, _ in a.fields] != [k for k, _ in b.fields]:
            raise _misfit(path or "the element", a, b)
        return spec.Named(
            a.name,
            tuple((k, _general(x, y, f"{path}.{k}")) for (k, x), (_, y) in zip(a.fields, b.fields)),
        )
    if not isinstance(b, tuple) or isinstance(b, spec.Named) or len(a) != len(b):
        raise _misfit(path or "the element", a, b)
    return tuple(_general(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))


def _misfit(path: str, want: Any, got: Any) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"element component {path} is {_describe(got)}, where element 0 has {_describe(want)}"
    )


def _describe(node: Any) -> str:
    if isinstance(node, Leaf):
        return f"{node.dtype} of shape {node.shape}"
    if isinstance(node, dict):
        return f"a dict of keys {sorted(node)}"
    if isinstance(node, spec.Named):
        return f"a {node.name} of fields {[k for k, _ in node.fields]}"
    return f"a sequence of {len(node)}"


class Flattener:
    """An element's components in the layout's order, checked against the spec: one
    Python step per component, no per-element spec objects."""

    def __init__(self, structure: Any) -> None:
        self.leaves = [leaf for _, leaf in spec.flatten(structure) if isinstance(leaf, Leaf)]
        self.paths = [path for path, _ in spec.flatten(structure)]
        self._structure = structure

    def values(self, index: int, element: Any) -> list[Any]:
        """The element's components in the layout's order, as given (its structure checked)."""
        flat: list[Any] = []
        try:
            _flat(self._structure, element, flat, "")
        except _Misfit as exc:
            raise InvalidArgumentError(
                f"element {index} does not fit the cache's spec, taken from the first "
                f"elements: component {exc.args[0] or 'the element'} {exc.args[1]}; make "
                "every element of one structure and dtype"
            ) from None
        return flat

    def arrays(self, index: int, values: list[Any]) -> list[np.ndarray]:
        """values() as arrays, each checked against its leaf's dtype and shape."""
        out = []
        for value, leaf, path in zip(values, self.leaves, self.paths):
            arr = _array(value, path)
            if not _fits(arr, leaf):
                raise InvalidArgumentError(
                    f"element {index} does not fit the cache's spec: component {path} is "
                    f"{arr.dtype} of shape {arr.shape}, where the first elements had "
                    f"{leaf.dtype} of shape {leaf.shape} (None: varies); give every element "
                    f"that dtype, and let dimensions that vary vary among the first "
                    f"{SPEC_ELEMENTS} elements"
                )
            out.append(arr)
        return out

    def __call__(self, index: int, element: Any) -> list[np.ndarray]:
        return self.arrays(index, self.values(index, element))

    def stacked(self, index: int, rows: list[list[Any]]) -> list[np.ndarray]:
        """rows (values() of consecutive elements from index) of a fixed-numeric layout as
        one stacked array per leaf, checked once per leaf; a row that does not fit is named
        by arrays()."""
        out = []
        for column, leaf in zip(zip(*rows), self.leaves):
            try:
                arr = np.asarray(column)
            except ValueError:  # components of different shapes
                arr = None
            if (
                arr is None
                or arr.shape[1:] != leaf.fixed_shape
                or arr.dtype.kind not in ("biufc")
                or not np.can_cast(arr.dtype, leaf.np_dtype, "safe")
            ):
                for i, row in enumerate(rows):
                    self.arrays(index + i, row)  # raises, naming the element
            out.append(np.asarray(arr, leaf.np_dtype))
        return out


class _Misfit(Exception):
    pass


def _flat(node: Any, value: Any, out: list[Any], path: str) -> None:
    if isinstance(node, Leaf):
        out.append(value)
    elif isinstance(node, dict):
        if not isinstance(value, dict) or len(value) != len(node):
            raise _Misfit(
                path, f"is {type(value).__name__} {_keys(value)}, not a dict of keys {sorted(node)}"
            )
        for k in sorted(node):
            if k not in value:
                raise _Misfit(path, f"lacks key {k!r}")
            _flat(node[k], value[k], out, f"{path}[{k!r}]")
    else:
        fields = node.fields if isinstance(node, spec.Named) else tuple(enumerate(node))
        if not isinstance(value, (tuple, list)) or len(value) != len(fields):
            raise _Misfit(
                path, f"is {type(value).__name__}, not a sequence of {len(fields)} components"
            )
        for (k, child), v in zip(fields, value):
            _flat(child, v, out, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]")


def _keys(value: Any) -> str:
    return str(sorted(value)) if isinstance(value, dict) else ""


def _fits(arr: np.ndarray, leaf: Leaf) -> bool:
    if leaf.is_string:
        if arr.dtype != object:
            return False
    elif arr.dtype != leaf.np_dtype and not np.can_cast(arr.dtype, leaf.np_dtype, "safe"):
        return False
    return leaf.shape is None or (
        arr.ndim == len(leaf.shape)
        and all(want is None or want == got for got, want in zip(arr.shape, leaf.shape))
    )


def _leaf_values(element: Any) -> Iterator[Any]:
    if isinstance(element, dict):
        for v in element.values():
            yield from _leaf_values(v)
    elif isinstance(element, (tuple, list)):
        for v in element:
            yield from _leaf_values(v)
    else:
        yield element


def write(
    daemons: Daemons,
    name: str,
    elements: Iterable[Any],
    version: str | None,
    block_bytes: int,
    direct: direct_read.Mode,
    local_data_dir: Path | None,
) -> pb.Cache:
    """Build cache name from elements (checked arguments; client/_client.py)."""
    try:
        existing: pb.Cache | None = daemons.get(name)
    except CacheNotFoundError:
        existing = None
    if (
        existing is not None
        and version is not None
        and (
            existing.fingerprint == f"version:{version}" and existing.state == pb.CACHE_STATE_READY
        )
    ):
        return existing  # written once: the elements are not iterated
    if existing is not None:
        raise CacheExistsError(
            f"cache {name!r} exists (fingerprint {existing.fingerprint}); delete it first "
            f"(cc.delete({name!r})) to write it again, or pass version= to write once and "
            "reuse the cache while the version stays"
        )
    it = iter(elements)
    head: list[Any] = []
    held = 0
    for element in it:
        head.append(element)
        held += sum(_array(v, "").nbytes for v in _leaf_values(element))
        if len(head) >= SPEC_ELEMENTS or held >= SPEC_BYTES:
            break
    if not head:
        raise InvalidArgumentError(
            f"cannot write cache {name!r}: the iterable yielded no "
            "elements, so there is no element spec to store"
        )
    structure = infer(head)
    element_spec = spec.encode(structure)
    try:
        layout = blocked(
            Layout(tuple(leaf for _, leaf in spec.flatten(structure))),  # type: ignore[misc]
            block_bytes,
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"cannot write cache {name!r}: {exc}") from exc
    fingerprint = (
        f"version:{version}"
        if version is not None
        else f"numpy:{hashlib.sha256(element_spec).hexdigest()[:16]}"
    )
    begin = pb.WriteBegin(
        name=name, fingerprint=fingerprint, layout_json=layout.to_json(), element_spec=element_spec
    )
    reads = direct_read.DirectReads(daemons.home(name), direct, local_data_dir)
    writer = direct_write.writer_for(daemons.home(name), begin, reads, local_data_dir)
    begun = writer.begin()
    if begun.decision == pb.WRITE_DECISION_ALREADY_READY:
        writer.abort()
        return begun.cache
    if begun.decision != pb.WRITE_DECISION_ACCEPTED:
        writer.abort()
        raise CacheExistsError(
            f"cache {name!r} is being written by another process; wait for it, then read it"
        )
    try:
        packer = BlockPacker(layout)
        flatten = Flattener(structure)
        for n, batch in _batches(
            layout, flatten, itertools.chain(head, it), write_batch_elements(layout)
        ):
            writer.add(*packer.add(batch, n))
        writer.add(*packer.flush())
        return writer.finish()
    except BaseException:
        writer.abort()
        raise


def _batches(
    layout: Layout, flatten: Flattener, elements: Iterator[Any], size: int
) -> Iterator[tuple[int, list[Any]]]:
    """(n, batch) of up to size elements, in BlockPacker's form: one stacked array per leaf
    of a fixed-numeric layout (checked once per leaf and batch), else one list of
    per-element arrays per leaf."""
    index = 0
    while True:
        rows = [
            flatten.values(index + i, e) for i, e in enumerate(itertools.islice(elements, size))
        ]
        if not rows:
            return
        if layout.fixed_numeric:
            batch: list[Any] = flatten.stacked(index, rows)
        else:
            arrays = [flatten.arrays(index + i, row) for i, row in enumerate(rows)]
            batch = [
                [np.asarray(v, leaf.np_dtype) for v in col]
                for col, leaf in zip(zip(*arrays), layout.leaves)
            ]
        yield len(rows), batch
        index += len(rows)
