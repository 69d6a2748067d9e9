"""The shapes of the variables a graph's functions read, stated inside them, for sizing loop and call bodies.

A loop body or a called function gets a variable as a resource argument. In
the step's own graph TensorFlow knows the variable behind a captured handle
(its handle data), but a body built from its FunctionDef does not: the body's
`ReadVariableOp` has an unknown shape, and so has everything computed from it
(in an RNN decoder's body, the cell's products and the attention's context):
unsized, the iteration the simulator replays would lack them.

`with_variable_shapes` copies a GraphDef and states, in each function a loop,
call or conditional runs (at any depth, following the resource arguments it
passes on; a conditional's first input, its predicate or branch index, is not
one of its branches' arguments), the
shape of every variable read of an argument whose variable is known
(`_output_shapes`, which importing the body applies). The copy is for sizing
and ordering bodies (`seqmem.edge.bodies`, `seqmem.edge.pinned_bodies`), not for
running. A function reached from several places takes the shapes of the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2

from seqmem.ir.graph import Graph
from seqmem.edge.library import branches
from seqmem.ir.op_tables import FUNCTION_CALL_OPS, FUNCTIONAL_COND_OPS, FUNCTIONAL_LOOP_OPS

__all__ = ["variable_shapes", "with_variable_shapes"]

_LOOP_FUNCTIONS = ("body", "cond")
_CALL_FUNCTIONS = ("f",)


def variable_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """The shape of the variable behind each of `graph`'s resource handles where TensorFlow knows it
    (`TensorInfo.handle_shape`), by the name of the node whose first output is the handle."""
    return {name: node.outputs[0].handle_shape for name, node in graph.nodes.items()
            if node.outputs and node.outputs[0].handle_shape is not None}


def with_variable_shapes(graph_def: graph_pb2.GraphDef,
                         shapes: Mapping[str, tuple[int, ...]]) -> graph_pb2.GraphDef:
    """A copy of `graph_def` whose functions state the shapes of the variables they read (module
    docstring); `shapes` by the name of the graph's node that outputs the handle. `graph_def` itself when
    there is nothing to state."""
    if not shapes or not graph_def.library.function:
        return graph_def
    shaped = graph_pb2.GraphDef()
    shaped.CopyFrom(graph_def)
    functions = {f.signature.name: f for f in shaped.library.function}
    stated: dict[str, dict[str, tuple[int, ...]]] = {}  # function -> {argument: shape}

    def visit(nodes: Iterable[node_def_pb2.NodeDef], known: Mapping[str, tuple[int, ...]], inside: bool) -> None:
        for node in nodes:
            inputs = [name for name in node.input if not name.startswith("^")]
            if node.op in FUNCTIONAL_COND_OPS:
                called, arguments_from = [branch.name for branch in branches(node)], inputs[1:]
            else:
                called = [node.attr[key].func.name for key in (
                    _LOOP_FUNCTIONS if node.op in FUNCTIONAL_LOOP_OPS
                    else _CALL_FUNCTIONS if node.op in FUNCTION_CALL_OPS else ())]
                arguments_from = inputs
            for name in called:
                function = functions.get(name)
                if function is None:
                    continue
                arguments = stated.setdefault(function.signature.name, {})
                added = {arg.name: known[source] for arg, source in zip(function.signature.input_arg, arguments_from)
                         if arg.type == types_pb2.DT_RESOURCE and source in known and arg.name not in arguments}
                if added:
                    arguments.update(added)
                    visit(function.node_def, dict(arguments), inside=True)
            if inside and node.op == "ReadVariableOp" and inputs and inputs[0] in known:
                output_shapes = node.attr["_output_shapes"].list.shape
                del output_shapes[:]
                output_shapes.append(tf.TensorShape(list(known[inputs[0]])).as_proto())

    visit(shaped.node, {**shapes, **{f"{name}:0": shape for name, shape in shapes.items()}}, inside=False)
    return shaped
