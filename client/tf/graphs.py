"""Pipelines as graphs: the fingerprint a cache is keyed on, and pipelines shipped to
the daemon for server-side materialization (docs/materialize.md).

Both start from tf.data's own serialization of the pipeline
(``DatasetToGraphV2``). A fingerprint hashes it after removing what differs
between processes that build the same pipeline; a shipped pipeline is sent as
it is, the way tf.data service ships datasets to its workers.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.framework import op_def_registry

from client.errors import InvalidArgumentError
from client.tf.convert import decode_spec, encode_spec


def fingerprint_of(dataset: tf.data.Dataset, version: str | None) -> str:
    """What produced the cache: the user's version, or a hash of the dataset graph.

    The graph is tf.data's own serialization of the pipeline, made independent
    of the process that built it (see :func:`_canonical_graph`), so the same
    pipeline built in another process gets the same fingerprint. It cannot see
    inside py_function or generator code: pass version= to key on those. Nor
    can it see the pipeline a tf.data service dispatcher runs: only the service
    read's processing mode and what follows it (not its address or job name).

    tf.data's DatasetFingerprint op is not used: on TF 2.21 its node cache is
    keyed by pointers into function bodies it has already freed, so a pipeline
    with several functions hashes nondeterministically and two pipelines that
    differ only inside a function can get the same fingerprint.
    """
    if version is not None:
        return f"version:{version}"
    try:
        serialized = tf.raw_ops.DatasetToGraphV2(
            input_dataset=dataset._variant_tensor,
            external_state_policy=_POLICY_IGNORE,
            strip_device_assignment=True,
        ).numpy()
    except tf.errors.OpError as exc:
        raise InvalidArgumentError(
            f"cannot fingerprint this pipeline ({exc.message}); pass "
            "version= to key the cache explicitly"
        ) from exc
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized)
    digest = hashlib.sha256(_canonical_graph(graph).SerializeToString(deterministic=True))
    spec = hashlib.sha256(encode_spec(dataset.element_spec)).hexdigest()[:16]
    return f"graph:{digest.hexdigest()[:16]}-{spec}"


_POLICY_IGNORE = 1  # ExternalStatePolicy: serialize stateful functions without complaint
#: Ops whose seed inputs tf.data's own graph hash ignores (they vary from run to run).
_SEEDED_OPS = ("ShuffleDataset", "ShuffleAndRepeatDataset", "AnonymousRandomSeedGenerator")
_SEED_INPUTS = frozenset({"seed", "seed2", "seed_generator"})
#: tf.data service reads: inputs and attrs that name the run, not the data (the dispatcher's
#: address and protocol, the job, the id the dispatcher assigned, request tuning).
_SERVICE_OPS = ("DataServiceDataset",)
_SERVICE_INPUTS = frozenset(
    {
        "dataset_id",
        "address",
        "protocol",
        "job_name",
        "max_outstanding_requests",
        "iteration_counter",
    }
)
_SERVICE_ATTRS = ("task_refresh_interval_hint_ms", "data_transfer_protocol", "target_workers")
#: Ops naming their Python callable by a per-process registry token.
_PY_FUNC_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
_RESOURCE = types_pb2.DT_RESOURCE


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":", 1)[0]


def _cut_inputs(node: node_def_pb2.NodeDef, names: frozenset[str]) -> None:
    """Remove node's data inputs whose op-def names are in names."""
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return
    kept = [
        x
        for i, x in enumerate(node.input)
        if x.startswith("^") or i >= len(op_def.input_arg) or op_def.input_arg[i].name not in names
    ]
    del node.input[:]
    node.input.extend(kept)


def _canonical_graph(graph: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """The pipeline's graph without what differs between processes building it.

    Library functions are renamed f0, f1, ... in order of first use (their
    names carry per-process counters); py_func registry tokens, tf.data
    ``metadata`` (per-process dataset ids), resource handle names and devices,
    debug info and the graph's producer version are dropped; seed inputs of
    shuffles are cut as tf.data's own hash does, and so are a tf.data service
    read's per-run inputs (dispatcher address, protocol, job name, dataset id);
    nodes no longer reachable from the outputs go with them. graph is modified
    in place.
    """
    library = {f.signature.name: f for f in graph.library.function}
    names: dict[str, str] = {}

    def ref(name: str) -> str:
        if name in library and name not in names:
            names[name] = f"f{len(names)}"
        return names.get(name, name)

    def clean_attr(value: attr_value_pb2.AttrValue) -> None:
        funcs = [value.func] if value.HasField("func") else list(value.list.func)
        for func in funcs:
            func.name = ref(func.name)
            for key in sorted(func.attr):
                clean_attr(func.attr[key])
        if value.HasField("tensor") and value.tensor.dtype == _RESOURCE:
            for handle in value.tensor.resource_handle_val:
                handle.ClearField("device")
                handle.ClearField("container")
                handle.ClearField("name")
                handle.ClearField("hash_code")

    def clean_nodes(nodes: Any, roots: list[str]) -> list[node_def_pb2.NodeDef]:
        by_name = {n.name: n for n in nodes}
        for node in nodes:
            if node.op.startswith(_SEEDED_OPS):
                _cut_inputs(node, _SEED_INPUTS)
            elif node.op.startswith(_SERVICE_OPS):
                _cut_inputs(node, _SERVICE_INPUTS)
                for key in _SERVICE_ATTRS:
                    node.attr.pop(key, None)
        reachable: set[str] = set()
        stack = [r for r in roots if r in by_name]
        while stack:
            name = stack.pop()
            if name in reachable:
                continue
            reachable.add(name)
            stack.extend(n for n in map(_node_name, by_name[name].input) if n in by_name)
        out = []
        for node in nodes:  # in their serialized order, which is deterministic
            if node.name not in reachable:
                continue
            node.device = ""
            node.ClearField("experimental_debug_info")
            node.op = ref(node.op)
            node.attr.pop("metadata", None)
            if node.op in _PY_FUNC_OPS:
                node.attr.pop("token", None)
            for key in sorted(node.attr):
                clean_attr(node.attr[key])
            out.append(node)
        return out

    result = graph_pb2.GraphDef()
    roots = [n.name for n in graph.node if n.op == "_Retval"]
    result.node.extend(clean_nodes(graph.node, roots))
    done = 0
    while done < len(names):  # functions in order of first use; using one may name more
        original = list(names)[done]
        fdef = library[original]
        fdef.signature.name = names[original]
        fn_roots = [_node_name(r) for r in [*fdef.ret.values(), *fdef.control_ret.values()]]
        nodes = clean_nodes(fdef.node_def, fn_roots)
        del fdef.node_def[:]
        fdef.node_def.extend(nodes)
        for key in sorted(fdef.attr):
            clean_attr(fdef.attr[key])
        result.library.function.append(fdef)
        done += 1
    return result


_POLICY_FAIL = 2  # ExternalStatePolicy: refuse stateful functions (py_function, generators)


def serialize_dataset(dataset: tf.data.Dataset) -> tuple[bytes, bytes]:
    """(GraphDef bytes, element_spec bytes) of a pipeline built from TF ops only.

    Serialized the way tf.data service ships datasets to its workers; a
    pipeline holding Python code (py_function, from_generator, numpy_function)
    cannot be, and gets an InvalidArgumentError saying what to do instead.
    """
    try:
        graph = tf.raw_ops.DatasetToGraphV2(
            input_dataset=dataset._variant_tensor,
            external_state_policy=_POLICY_FAIL,
            strip_device_assignment=True,
        ).numpy()
    except tf.errors.OpError as exc:
        detail = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", exc.message)
        raise InvalidArgumentError(
            f"this dataset cannot be shipped to the daemon ({detail}): it runs Python "
            "code (py_function, from_generator, numpy_function). Materialize it through an "
            "entry point instead (cc.materialize('package.module:fn', ...) with "
            "fn(shard_index, num_shards) -> tf.data.Dataset, importable on the daemon's host), "
            "or cache it by write-through with cc.cache(ds, name=...)"
        ) from exc
    return graph, encode_spec(dataset.element_spec)


def dataset_from_graph(graph: bytes, element_spec: bytes) -> tf.data.Dataset:
    """Rebuild a dataset serialize_dataset() produced (tf.data service style)."""
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph)
    return dataset_ops._VariantDataset(variant, decode_spec(element_spec))
