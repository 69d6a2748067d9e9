"""Four-way (or wider) splits rewritten so that their outputs are allocated one after another.

TensorFlow's CPU `Split` kernel allocates its outputs inside a parallel loop
when it splits four ways or more and its input is of middling size
(`SplitOpCPUImpl`: `num_split >= 4` and between `max(threads, num_split) * 4096`
and `num_split * 180 * 1024` elements). Intra-op threads then ask the allocator
for the outputs' buffers in whatever order they happen to run, so the same step
gets other free chunks from one call to the next, and every later request with
them. An LSTM cell splits its gates four ways, so the peak of a step with
LSTM cells can move from one call to the next.

`Unpack` of the input reshaped to [..., num_split, size / num_split, ...]
returns the same outputs, copies of the same elements, bit for bit, and its
kernel allocates them one after another in output order. It is one node making
every output at once, as the simulator models a `Split`, so predictions do not
change; the reshape is a view. The unpack keeps the split's name, so every
reference to an output stays valid. The reshape's target may leave one size
unknown (-1): that of the dimension the split divides (a decoder cell's gates in
its loop body), or that of another one. A split
whose input's rank is unknown, or which has more than one dimension of unknown
size, is left as it is; so are `SplitV` (uneven sizes), and splits under four
ways, which allocate in order.
On a GPU, `Split` allocates in order; there the rewrite adds one view.

A function whose splits are rewritten, or that calls one that is, is replaced by
a copy named `<name>_seqmem_unpacked` that every reference follows: a function
already registered under its own name cannot change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from seqmem.edge import library

__all__ = ["unpack_splits", "PARALLEL_SPLIT_WAYS"]

# The fewest ways TensorFlow's CPU Split kernel allocates its outputs in parallel for
PARALLEL_SPLIT_WAYS = 4
_SUFFIX = "_seqmem_unpacked"


def unpack_splits(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` whose splits of `PARALLEL_SPLIT_WAYS` ways or more, in the graph and in
    its library's functions, are unpacks of the reshaped input (module docstring); functions renamed
    as the module docstring says. Returns `graph_def` itself when no split is rewritten."""
    if not any(_wide_split(node) for node in _all_nodes(graph_def)):
        return graph_def
    rewritten = graph_pb2.GraphDef()
    rewritten.CopyFrom(graph_def)
    shapes_graph = tf.Graph()
    with shapes_graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        function_graphs = {f.signature.name: function_def_to_graph(f) for f in graph_def.library.function
                           if any(_wide_split(node) for node in f.node_def)}
    added = _unpack(rewritten.node, shapes_graph, in_function=False)
    rewritten.node.extend(added)
    edited = []
    for function in rewritten.library.function:
        if function.signature.name in function_graphs:
            added_here = _unpack(function.node_def, function_graphs[function.signature.name], in_function=True)
            if added_here:
                function.node_def.extend(added_here)
                edited.append(function.signature.name)
    if not added and not edited:
        return graph_def
    library.use_copies(rewritten, edited, _SUFFIX)
    return rewritten


def _all_nodes(graph_def: graph_pb2.GraphDef) -> Iterable[node_def_pb2.NodeDef]:
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def _wide_split(node: node_def_pb2.NodeDef) -> bool:
    return node.op == "Split" and node.attr["num_split"].i >= PARALLEL_SPLIT_WAYS


def _unpack(nodes: Iterable[node_def_pb2.NodeDef], shapes_graph: tf.Graph,
            in_function: bool) -> list[node_def_pb2.NodeDef]:
    """Rewrite each wide split among `nodes` whose target shape is known into an unpack (in place);
    return the nodes to add (each one's reshape and its shape constant)."""
    output = ":output:0" if in_function else ""
    added = []
    for node in nodes:
        if not _wide_split(node):
            continue
        ways = node.attr["num_split"].i
        reshaped = _reshaped_shape(shapes_graph.get_operation_by_name(node.name), ways)
        if reshaped is None:
            continue
        target, axis = reshaped
        control = [name for name in node.input if name.startswith("^")]
        shape = node_def_pb2.NodeDef(name=f"{node.name}/seqmem_unpack_shape", op="Const", device=node.device,
                                     input=control)
        shape.attr["dtype"].type = tf.int32.as_datatype_enum
        shape.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.array(target, np.int32)))
        reshape = node_def_pb2.NodeDef(name=f"{node.name}/seqmem_unpack_reshape", op="Reshape", device=node.device,
                                       input=[node.input[1], shape.name + output])
        reshape.attr["T"].CopyFrom(node.attr["T"])
        reshape.attr["Tshape"].type = tf.int32.as_datatype_enum
        dtype = node.attr["T"].type
        node.op = "Unpack"
        del node.input[:]
        node.input.extend([reshape.name + output, *control])
        node.attr.clear()
        node.attr["T"].type = dtype
        node.attr["num"].i = ways
        node.attr["axis"].i = axis
        added += [shape, reshape]
    return added


def _reshaped_shape(split: tf.Operation, ways: int) -> Optional[tuple[list[int], int]]:
    """The shape to reshape a split's input to (-1 for its one unknown size) and the axis to unpack, or None
    where the axis, the input's rank or more than one of its sizes are unknown."""
    split_dim, value = split.inputs
    dim = tf.get_static_value(split_dim)
    if dim is None or value.shape.rank is None:
        return None
    axis = int(dim) % value.shape.rank
    sizes = [-1 if size is None else size for size in value.shape.as_list()]
    if sizes.count(-1) > 1:
        return None
    part = -1 if sizes[axis] < 0 else sizes[axis] // ways
    return sizes[:axis] + [ways, part] + sizes[axis + 1:], axis
