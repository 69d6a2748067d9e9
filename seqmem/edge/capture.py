"""The TensorFlow edge: TF objects -> `Graph`, and `Graph` -> `GraphDef`.

Accepted targets: a `tf.function` (with input specs or its own input signature),
a `ConcreteFunction`, a TF1 `tf.Graph`, or a `GraphDef`. Everything is read
through a `tf.Graph` so that dtypes and static shapes come from TensorFlow's own
shape inference. The function library (loop bodies, called functions) is carried
along untouched.

Sizes (`TensorInfo`, `Node`):
- a numeric tensor: dtype size x element count, from static shapes; tensors
  computed from a TensorList stacked after its loop take the list's length
  into their shapes (`seqmem.edge.stack_lengths`);
- a resource handle: 0 bytes; the variable's buffer is booked on the handle
  node (`resource_bytes`), and the variable's shape, where TensorFlow knows it,
  kept for sizing the bodies that read it (`handle_shape`,
  `seqmem.edge.variable_shapes`);
- a variant holding a TensorList (a loop's accumulator, a TensorArray): sized
  by following it back to the list's creation (`seqmem.edge.list_sizes`), each
  element a buffer of its own (`element_bytes`); a list made from a tensor
  takes that tensor's refined shape (a gradient's `TensorListFromTensor` of the
  stacked decoder outputs);
- an output that a called function or a loop returns unchanged shares its
  input's buffer (`passes_input`, `seqmem.edge.passthrough`), as does x + 0,
  x * 1 or x / 1, which Grappler replaces with x
  (`seqmem.edge.folded_constants.neutral_arithmetic`), and a transpose that
  moves no data (`seqmem.edge.passthrough.transposes_in_place`);
- a read of a variable in copy-on-read mode owns a copy (`copies_input`,
  `seqmem.edge.copy_on_read`);
- the constants a called function or a loop's functions hold once
  instantiated are booked on the call or loop node (`constant_sizes`), and
  nodes TensorFlow replaces with constants it keeps are marked `folded`
  (`seqmem.edge.folded_constants`);
- other unknowns are None.

A node that computes what an earlier one computes, which Grappler merges into
it, is marked (`Node.duplicate_of`, `seqmem.edge.duplicates`) and kept; a sum
of three or more terms reads the node it duplicates, as it does once merged
(`seqmem.ir.merged.sums_read_merged`: the order it adds in).

A function's graph is captured as TensorFlow instantiates it: without the
stateless nodes that reach neither a return value, a control output nor a
stateful op (`instantiated_nodes`), which TensorFlow prunes before it runs the
function (a custom gradient's unused outputs, such as `tf.nn.silu`'s gradient
for its constant `beta`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction
from tensorflow.python.ops import handle_data_util

from seqmem.edge.copy_on_read import copying_reads
from seqmem.edge.duplicates import duplicate_nodes
from seqmem.edge.folded_constants import constant_ops, folded_ops, held_constants, neutral_arithmetic
from seqmem.edge.library import FunctionBodies
from seqmem.edge.list_sizes import ListSizer
from seqmem.edge.passthrough import passed_through_inputs, transposes_in_place
from seqmem.edge.sizes import static_bytes
from seqmem.edge.stack_lengths import stacked_shapes
from seqmem.errors import UnknownShapeError
from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef
from seqmem.ir.merged import sums_read_merged
from seqmem.ir.op_tables import TF1_CONTROL_FLOW_OPS

__all__ = ["concrete_function", "from_tf", "instantiated_nodes", "to_graph_def", "to_tf_graph"]

_ACCEPTED = "a tf.function, a ConcreteFunction, a tf.Graph or a GraphDef"


def concrete_function(target: Any, input_specs: Sequence[Any] = ()) -> ConcreteFunction:
    """The ConcreteFunction of a tf.function for `input_specs` (TensorSpecs or tensors).

    Raises TypeError if `target` is no tf.function or ConcreteFunction, and
    UnknownShapeError when a tf.function has neither specs nor an input signature.
    """
    if isinstance(target, ConcreteFunction):
        return target
    if hasattr(target, "get_concrete_function"):
        if not input_specs and getattr(target, "input_signature", None) is None:
            raise UnknownShapeError(
                "this tf.function has no input_signature: pass its input specs, e.g. "
                "seqmem.profile(step, tf.TensorSpec([32, 784], tf.float32), tf.TensorSpec([32], tf.int32))"
            )
        return target.get_concrete_function(*input_specs)
    raise TypeError(f"expected a tf.function or a ConcreteFunction, got {type(target).__name__}")


def to_tf_graph(target: Any, input_specs: Sequence[Any] = ()) -> tuple[tf.Graph, tuple[str, ...]]:
    """The tf.Graph behind `target` and the names of its output tensors (empty for TF1 graphs)."""
    if isinstance(target, graph_pb2.GraphDef):
        tf_graph = tf.Graph()
        with tf_graph.as_default():
            tf.graph_util.import_graph_def(target, name="")
        return tf_graph, ()
    if isinstance(target, tf.Graph):
        return target, ()
    if isinstance(target, ConcreteFunction) or hasattr(target, "get_concrete_function"):
        function = concrete_function(target, input_specs)
        return function.graph, tuple(t.name for t in function.graph.outputs)
    raise TypeError(f"cannot capture a {type(target).__name__}: expected {_ACCEPTED}")


def from_tf(target: Any, input_specs: Sequence[Any] = (), trip_counts: Optional[Mapping[str, int]] = None) -> Graph:
    """The seqmem `Graph` of `target` (see the module docstring for what is accepted).

    trip_counts: iterations of the graph's own while loops, by node name, for loops whose condition sets no
    constant bound (`unbounded_loops`; measured by `seqmem.runtime.trip_counts`); a constant bound wins.
    Raises TypeError for anything else.
    """
    tf_graph, output_names = to_tf_graph(target, input_specs)
    graph_def = target if isinstance(target, graph_pb2.GraphDef) else tf_graph.as_graph_def()
    variable_bytes = _captured_variable_bytes(tf_graph)
    bodies = FunctionBodies(graph_def.library)
    sizer = ListSizer(bodies, tf_graph, trip_counts=trip_counts)
    constant = constant_ops(tf_graph)
    constants = held_constants(tf_graph, bodies, constant)
    folded = folded_ops(tf_graph, constant)
    passed = passed_through_inputs(tf_graph, bodies)
    passed.update({name: {0: index} for name, index in neutral_arithmetic(tf_graph).items()})
    passed.update({name: {0: 0} for name in transposes_in_place(tf_graph)})
    copying = copying_reads(tf_graph, bodies)
    shapes = stacked_shapes(tf_graph, graph_def, sizer.length)
    sizer = ListSizer(bodies, tf_graph, shapes, trip_counts)
    kept = instantiated_nodes(tf_graph, output_names) if output_names else None
    duplicates = duplicate_nodes(tf_graph, [node.name for node in graph_def.node if node.name in kept],
                                 {op.name for op in _returned_ops(tf_graph, output_names)}) if kept is not None else {}
    nodes = []
    for node_def in graph_def.node:
        if kept is not None and node_def.name not in kept:
            continue
        op = tf_graph.get_operation_by_name(node_def.name)
        outputs = tuple(_tensor_info(t, sizer, shapes.get(t.name, t.shape), passed.get(op.name, {}).get(index),
                                     op.name in copying)
                        for index, t in enumerate(op.outputs))
        nodes.append(_node(node_def, op, outputs, variable_bytes.get(node_def.name, 0),
                           constants.get(node_def.name, ()), node_def.name in folded,
                           duplicates.get(node_def.name, "")))
    return sums_read_merged(Graph(
        nodes,
        outputs=[TensorRef.parse(name) for name in output_names],
        library=graph_def.library if graph_def.HasField("library") else None,
        versions=graph_def.versions if graph_def.HasField("versions") else None,
    ))


def instantiated_nodes(tf_graph: tf.Graph, output_names: Sequence[str]) -> frozenset[str]:
    """Names of the nodes of a function's graph that TensorFlow keeps when it instantiates the function
    (`PruneFunctionBody`): the inputs (placeholders), and what the return values (`output_names`), the
    function's control outputs, its stateful ops and control-flow ops reach through data and control
    edges."""
    roots = _returned_ops(tf_graph, output_names)
    roots += [op for op in tf_graph.get_operations()
              if op.type == "Placeholder" or op.type in TF1_CONTROL_FLOW_OPS or op.op_def.is_stateful]
    kept, pending = set(), list(roots)
    while pending:
        op = pending.pop()
        if op.name in kept:
            continue
        kept.add(op.name)
        pending.extend(tensor.op for tensor in op.inputs)
        pending.extend(op.control_inputs)
    return frozenset(kept)


def _returned_ops(tf_graph: tf.Graph, output_names: Sequence[str]) -> list[tf.Operation]:
    """The ops whose outputs a function returns (`output_names`), then its control outputs."""
    return ([tf_graph.get_tensor_by_name(name).op for name in output_names]
            + list(getattr(tf_graph, "control_outputs", [])))


def to_graph_def(graph: Graph) -> graph_pb2.GraphDef:
    """Write `graph` back as a GraphDef; `to_graph_def(from_tf(graph_def)) == graph_def`."""
    graph_def = graph_pb2.GraphDef()
    if graph.library is not None:
        graph_def.library.CopyFrom(graph.library)
    if graph.versions is not None:
        graph_def.versions.CopyFrom(graph.versions)
    for node in graph.nodes.values():
        node_def = graph_def.node.add()
        node_def.name = node.name
        node_def.op = node.op
        node_def.device = node.device
        node_def.input.extend(_input_name(ref) for ref in node.inputs)
        node_def.input.extend("^" + name for name in node.control_inputs)
        for key, value in node.attrs.items():
            node_def.attr[key].CopyFrom(value)
        for key, value in node.extras.items():
            getattr(node_def, key).CopyFrom(value)
    return graph_def


def _input_name(ref: TensorRef) -> str:
    return ref.node if ref.index == 0 else str(ref)


def _node(node_def: node_def_pb2.NodeDef, op: tf.Operation, outputs: tuple[TensorInfo, ...], resource_bytes: int,
          constant_sizes: tuple[int, ...], folded: bool, duplicate_of: str) -> Node:
    inputs, control_inputs = [], []
    for name in node_def.input:
        if name.startswith("^"):
            control_inputs.append(name[1:])
        else:
            inputs.append(TensorRef.parse(name))
    extras = {
        key: getattr(node_def, key)
        for key in ("experimental_debug_info", "experimental_type")
        if node_def.HasField(key)
    }
    if op.type == "VarHandleOp":
        resource_bytes = static_bytes(op.get_attr("dtype"), op.get_attr("shape")) or 0
    return Node(
        name=node_def.name,
        op=node_def.op,
        inputs=tuple(inputs),
        control_inputs=tuple(control_inputs),
        outputs=outputs,
        device=node_def.device,
        attrs=dict(node_def.attr),
        extras=extras,
        resource_bytes=resource_bytes,
        constant_sizes=constant_sizes,
        folded=folded,
        duplicate_of=duplicate_of,
    )


def _tensor_info(tensor: tf.Tensor, sizer: "ListSizer", static_shape: tf.TensorShape,
                 passes_input: int | None, copies_input: bool = False) -> TensorInfo:
    dtype = tensor.dtype.base_dtype
    shape = None if static_shape.rank is None else tuple(static_shape.as_list())
    if dtype == tf.resource:
        return TensorInfo(dtype=dtype.name, shape=shape, size_bytes=0, handle_shape=_variable_shape(tensor))
    if dtype == tf.variant:
        size, element_bytes = sizer.size(tensor) or (None, None)
        return TensorInfo(dtype=dtype.name, shape=shape, size_bytes=size, element_bytes=element_bytes,
                          passes_input=passes_input)
    elif shape is None or None in shape or dtype == tf.string:
        size = None
    else:
        size = math.prod(shape) * dtype.size
    return TensorInfo(dtype=dtype.name, shape=shape, size_bytes=size, passes_input=passes_input,
                      copies_input=copies_input)


def _variable_shape(handle: tf.Tensor) -> tuple[int, ...] | None:
    """The fully known shape of the variable behind resource tensor `handle`, from TensorFlow's handle data."""
    data = handle_data_util.get_resource_handle_data(handle)
    if not data.is_set or len(data.shape_and_type) != 1:
        return None
    shape = data.shape_and_type[0].shape
    if shape.unknown_rank or any(dim.size < 0 for dim in shape.dim):
        return None
    return tuple(dim.size for dim in shape.dim)


def _captured_variable_bytes(tf_graph: tf.Graph) -> dict[str, int]:
    """Bytes of each captured variable, keyed by the placeholder that holds its handle."""
    captures = getattr(tf_graph, "captures", ())
    variables = {id(v.handle): v for v in getattr(tf_graph, "variables", ())}
    result = {}
    for external, internal in captures:
        variable = variables.get(id(external))
        if variable is not None:
            result[internal.op.name] = static_bytes(variable.dtype, variable.shape) or 0
    return result
