"""Element specs without TensorFlow: the stored element_spec bytes, read and written.

A cache stores its element spec as TensorFlow's ``StructuredValue`` proto
(``nested_structure_coder.encode_structure``, serialized deterministically):
client/tf/convert.py's encode_spec. This module reads and writes the part of it
that dense elements use: dicts, tuples, lists and named tuples of
``TensorSpec`` s, each a :class:`Leaf` (dtype and shape) here. The schema is
declared below with TensorFlow's field numbers (tensorflow/core/protobuf/struct.proto,
framework/tensor_shape.proto and types.proto), in a descriptor pool of its own,
so the protobuf runtime serializes it byte for byte as TensorFlow does
(tests/integration/test_spec_bytes.py compares them). Composite tensors
(RaggedTensor, SparseTensor) are kept as :class:`Composite`, which readers of
plain arrays refuse by path.

Structures flatten in ``tf.nest.flatten``'s order: a dict's values by sorted
key, sequences in order; the layout's leaves (client/format/layout.py) are in
that order.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from client.format.layout import Leaf

#: types.proto's DataType numbers of the dtypes a layout holds.
DTYPES = {
    "float32": 1,
    "float64": 2,
    "int32": 3,
    "uint8": 4,
    "int16": 5,
    "int8": 6,
    "string": 7,
    "complex64": 8,
    "int64": 9,
    "bool": 10,
    "bfloat16": 14,
    "uint16": 17,
    "complex128": 18,
    "float16": 19,
    "uint32": 22,
    "uint64": 23,
}
_DTYPE_NAMES = {number: name for name, number in DTYPES.items()}
_MSG, _STR, _BOOL, _INT64, _SINT64, _ENUM, _INT32, _DOUBLE = 11, 9, 8, 3, 18, 14, 5, 1


@dataclass(frozen=True)
class Named:
    """A named tuple of the spec: its type's name and its fields in order."""

    name: str
    fields: tuple[tuple[str, Any], ...]

    @functools.cached_property
    def type(self) -> Any:
        return collections.namedtuple(self.name, [k for k, _ in self.fields])  # type: ignore[misc]


@dataclass(frozen=True)
class Composite:
    """A composite tensor's spec (RaggedTensorSpec, SparseTensorSpec, ...), by class name."""

    kind: str


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(
        name="shardcache_spec.proto", package="sc", syntax="proto3"
    )

    def message(
        name: str,
        *fields: tuple[str, int, int, str | None, bool],
        oneof: bool = False,
        parent: Any = None,
    ) -> Any:
        m = (parent.nested_type if parent is not None else f.message_type).add(name=name)
        if oneof:
            m.oneof_decl.add(name="kind")
        for fname, number, ftype, type_name, repeated in fields:
            field = m.field.add(
                name=fname,
                number=number,
                type=ftype,  # type: ignore[arg-type]
                label=3 if repeated else 1,
            )
            if type_name is not None:
                field.type_name = type_name
            if oneof:
                field.oneof_index = 0
        return m

    f.enum_type.add(name="DataType").value.extend(
        [
            descriptor_pb2.EnumValueDescriptorProto(name=f"DT_{n}", number=n)
            for n in sorted({0, *DTYPES.values()})
        ]
    )
    f.enum_type.add(name="TypeSpecClass").value.extend(
        [descriptor_pb2.EnumValueDescriptorProto(name=f"TS_{n}", number=n) for n in range(14)]
    )
    shape = message(
        "TensorShapeProto",
        ("dim", 2, _MSG, ".sc.TensorShapeProto.Dim", True),
        ("unknown_rank", 3, _BOOL, None, False),
    )
    message("Dim", ("size", 1, _INT64, None, False), ("name", 2, _STR, None, False), parent=shape)
    message("NoneValue")
    message(
        "TensorSpecProto",
        ("name", 1, _STR, None, False),
        ("shape", 2, _MSG, ".sc.TensorShapeProto", False),
        ("dtype", 3, _ENUM, ".sc.DataType", False),
    )
    message(
        "TypeSpecProto",
        ("type_spec_class", 1, _ENUM, ".sc.TypeSpecClass", False),
        ("type_state", 2, _MSG, ".sc.StructuredValue", False),
        ("type_spec_class_name", 3, _STR, None, False),
        ("num_flat_components", 4, _INT32, None, False),
    )
    message("ListValue", ("values", 1, _MSG, ".sc.StructuredValue", True))
    message("TupleValue", ("values", 1, _MSG, ".sc.StructuredValue", True))
    dict_value = message("DictValue", ("fields", 1, _MSG, ".sc.DictValue.FieldsEntry", True))
    entry = message(
        "FieldsEntry",
        ("key", 1, _STR, None, False),
        ("value", 2, _MSG, ".sc.StructuredValue", False),
        parent=dict_value,
    )
    entry.options.map_entry = True
    message(
        "PairValue", ("key", 1, _STR, None, False), ("value", 2, _MSG, ".sc.StructuredValue", False)
    )
    message(
        "NamedTupleValue",
        ("name", 1, _STR, None, False),
        ("values", 2, _MSG, ".sc.PairValue", True),
    )
    message(
        "StructuredValue",
        ("none_value", 1, _MSG, ".sc.NoneValue", False),
        ("float64_value", 11, _DOUBLE, None, False),
        ("int64_value", 12, _SINT64, None, False),
        ("string_value", 13, _STR, None, False),
        ("bool_value", 14, _BOOL, None, False),
        ("tensor_shape_value", 31, _MSG, ".sc.TensorShapeProto", False),
        ("tensor_dtype_value", 32, _ENUM, ".sc.DataType", False),
        ("tensor_spec_value", 33, _MSG, ".sc.TensorSpecProto", False),
        ("type_spec_value", 34, _MSG, ".sc.TypeSpecProto", False),
        ("bounded_tensor_spec_value", 35, _MSG, ".sc.TensorSpecProto", False),
        ("list_value", 51, _MSG, ".sc.ListValue", False),
        ("tuple_value", 52, _MSG, ".sc.TupleValue", False),
        ("dict_value", 53, _MSG, ".sc.DictValue", False),
        ("named_tuple_value", 54, _MSG, ".sc.NamedTupleValue", False),
        oneof=True,
    )
    return f


@functools.cache
def _structured_value() -> Any:
    pool = descriptor_pool.DescriptorPool()  # not the default pool TensorFlow's protos use
    pool.Add(_file())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sc.StructuredValue"))


def decode(data: bytes) -> Any:
    """The structure of a stored element_spec: dicts, tuples, lists, Named, with a Leaf per
    TensorSpec and a Composite per composite spec. ValueError when it is not one."""
    value = _structured_value()()
    try:
        value.ParseFromString(data)
    except Exception as exc:  # the runtime's DecodeError
        raise ValueError(f"not an element spec: {exc}") from exc
    return _decode(value)


def _decode(value: Any) -> Any:
    kind = value.WhichOneof("kind")
    if kind in ("tensor_spec_value", "bounded_tensor_spec_value"):
        spec = getattr(value, kind)
        if spec.dtype not in _DTYPE_NAMES:
            raise ValueError(f"a component of dtype number {spec.dtype}, which a cache cannot hold")
        shape = (
            None
            if spec.shape.unknown_rank
            else tuple(None if d.size < 0 else d.size for d in spec.shape.dim)
        )
        return Leaf(_DTYPE_NAMES[spec.dtype], shape)
    if kind == "dict_value":
        return {k: _decode(v) for k, v in sorted(value.dict_value.fields.items())}
    if kind == "tuple_value":
        return tuple(_decode(v) for v in value.tuple_value.values)
    if kind == "list_value":
        return [_decode(v) for v in value.list_value.values]
    if kind == "named_tuple_value":
        named = value.named_tuple_value
        return Named(named.name, tuple((p.key, _decode(p.value)) for p in named.values))
    if kind == "type_spec_value":
        spec = value.type_spec_value
        return Composite(spec.type_spec_class_name or f"type spec {spec.type_spec_class}")
    raise ValueError(
        f"an element spec holding {kind or 'nothing'}, which shardcache does "
        "not read without TensorFlow"
    )


def encode(structure: Any) -> bytes:
    """decode()'s inverse for dense structures: TensorFlow's encode_spec bytes exactly."""
    value = _structured_value()()
    _encode(structure, value)
    return bytes(value.SerializeToString(deterministic=True))


def _encode(node: Any, value: Any) -> None:
    if isinstance(node, Leaf):
        spec = value.tensor_spec_value
        spec.dtype = DTYPES[node.dtype]
        spec.shape.SetInParent()  # a scalar's shape is an empty message, present
        if node.shape is None:
            spec.shape.unknown_rank = True
        else:
            for d in node.shape:
                spec.shape.dim.add(size=-1 if d is None else d)
    elif isinstance(node, dict):
        value.dict_value.SetInParent()
        for k, v in node.items():
            _encode(v, value.dict_value.fields[k])
    elif isinstance(node, Named):
        named = value.named_tuple_value
        named.name = node.name
        for k, v in node.fields:
            _encode(v, named.values.add(key=k).value)
    elif isinstance(node, (tuple, list)):
        seq = value.tuple_value if isinstance(node, tuple) else value.list_value
        seq.SetInParent()
        for v in node:
            _encode(v, seq.values.add())
    else:
        raise ValueError(f"cannot encode {type(node).__name__} {node!r} as an element spec")


def _children(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        yield from ((repr(k), node[k]) for k in sorted(node))
    elif isinstance(node, Named):
        yield from ((f".{k}", v) for k, v in node.fields)
    else:
        yield from ((f"[{i}]", v) for i, v in enumerate(node))


def flatten(structure: Any, path: str = "") -> list[tuple[str, Leaf | Composite]]:
    """The structure's leaves in tf.nest.flatten's order, each with its path ("['image']")."""
    if isinstance(structure, (Leaf, Composite)):
        return [(path or "the element", structure)]
    out: list[tuple[str, Leaf | Composite]] = []
    for step, child in _children(structure):
        out += flatten(child, path + (f"[{step}]" if step.startswith("'") else step))
    return out


def packer(structure: Any) -> Callable[[Sequence[Any]], Any]:
    """A function from a flat list of values (flatten's order) to the structure's shape."""
    if isinstance(structure, (Leaf, Composite)):
        return lambda flat: flat[0]
    if all(isinstance(child, (Leaf, Composite)) for _, child in _children(structure)):
        # one value per child (a dict of arrays): no slice and call per child
        if isinstance(structure, dict):
            keys = sorted(structure)
            return lambda flat: dict(zip(keys, flat))
        if isinstance(structure, Named):
            make = structure.type
            return lambda flat: make(*flat)
        return list if isinstance(structure, list) else tuple
    parts, offsets, at = [], [], 0
    for _, child in _children(structure):
        parts.append(packer(child))
        offsets.append((at, at + len(flatten(child))))
        at = offsets[-1][1]

    def children(flat: Sequence[Any]) -> list[Any]:
        return [pack(flat[lo:hi]) for pack, (lo, hi) in zip(parts, offsets)]

    if isinstance(structure, dict):
        keys = sorted(structure)
        return lambda flat: dict(zip(keys, children(flat)))
    if isinstance(structure, Named):
        make = structure.type
        return lambda flat: make(*children(flat))
    if isinstance(structure, list):
        return children
    return lambda flat: tuple(children(flat))
