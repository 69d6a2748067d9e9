"""Computations a graph holds twice and TensorFlow runs once: Grappler's deduplication.

Before a function runs, Grappler's arithmetic optimizer (`DedupComputations`,
arithmetic_optimizer.cc) merges nodes that compute the same value: the same op,
device, attributes and data inputs (in order) and the same set of control
inputs, of an op free of side effects (not stateful, no reference inputs, not a
placeholder or a loop's Enter/Exit) whose outputs no in-place op reads; the
readers read the first of them. Constants merge too, and then what reads them:
Keras' NASNet applies the same ReLU to a cell's input in two layers and pads
each result the same way (each padding its own constant): its graph holds
both, TensorFlow computes and keeps one.

Capture marks each such node with the node it duplicates (`Node.duplicate_of`)
and keeps it: seqmem's passes read a graph as written (two losses' gradient
seeds that merge are still two seeds to the anatomy), and a rewritten step's
pinning control edges keep Grappler from merging. The simulation of a step as
it ran merges them (`seqmem.ir.merged.merged_duplicates`). Nodes whose outputs
are TensorLists or resource handles are not marked: seqmem's loop and variable
models follow each by its node.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import tensorflow as tf

from seqmem.ir.op_tables import STEP_ARGUMENT_OPS, TF1_CONTROL_FLOW_OPS

__all__ = ["duplicate_nodes"]

# Ops that write into an input's buffer: Grappler merges nothing they read (`FeedsInPlaceOp`), nor what
# reaches them through ops that pass a buffer on.
_IN_PLACE_OPS = frozenset(["InplaceAdd", "InplaceSub", "InplaceUpdate"])
_PASSING_ON = frozenset(["Identity", "IdentityN", "Reshape", "ExpandDims"])


def duplicate_nodes(tf_graph: tf.Graph, names: Sequence[str], preserved: Collection[str]) -> dict[str, str]:
    """{name of a node of `names` that computes what an earlier one computes: that earlier node's name}; the
    earlier node is never itself a duplicate, and each node's inputs are compared as merged, so that a chain
    computed twice merges whole. preserved: names never merged away (the function's outputs); they may
    stand for others."""
    representative: dict[str, str] = {}
    first: dict[tuple, str] = {}
    feeding_in_place = _feeding_in_place_ops(tf_graph)
    for name in names:
        op = tf_graph.get_operation_by_name(name)
        if name in feeding_in_place or not _mergeable(op):
            continue
        key = _key(op, representative)
        if key not in first:
            first[key] = name
        elif name not in preserved:
            representative[name] = first[key]
    return representative


def _mergeable(op: tf.Operation) -> bool:
    if op.type in STEP_ARGUMENT_OPS or op.type in TF1_CONTROL_FLOW_OPS:
        return False
    if op.op_def.is_stateful or any(arg.is_ref for arg in op.op_def.input_arg):
        return False
    # lists, handles: seqmem's loop and variable models follow each one by its node
    return not any(output.dtype in (tf.variant, tf.resource) for output in op.outputs)


def _feeding_in_place_ops(tf_graph: tf.Graph) -> set[str]:
    """Names of the ops whose outputs an in-place op reads, directly or through ops that pass a buffer on."""
    feeding: set[str] = set()
    pending = [op for op in tf_graph.get_operations() if op.type in _IN_PLACE_OPS]
    while pending:
        for tensor in pending.pop().inputs:
            if tensor.op.name not in feeding:
                feeding.add(tensor.op.name)
                if tensor.op.type in _PASSING_ON:
                    pending.append(tensor.op)
    return feeding


def _key(op: tf.Operation, representative: Mapping[str, str]) -> tuple:
    node_def = op.node_def
    attrs = tuple(sorted((key, value.SerializeToString(deterministic=True)) for key, value in node_def.attr.items()))
    data = tuple(_renamed(name, representative) for name in node_def.input if not name.startswith("^"))
    controls = frozenset(representative.get(name[1:], name[1:]) for name in node_def.input if name.startswith("^"))
    return op.type, node_def.device, attrs, data, controls


def _renamed(input_name: str, representative: Mapping[str, str]) -> str:
    node, colon, index = input_name.partition(":")
    return representative.get(node, node) + colon + index
