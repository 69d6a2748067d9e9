"""Keep variables in place: an assignment writes into the variable's buffer instead of taking the value's.

TensorFlow's `AssignVariableOp` adopts its value's buffer (even when another op
reads the value after the assignment, Grappler on or off): the
variable moves to wherever the value was allocated, among the step's
activations, and its old buffer is freed. Keras' optimizers assign every
momentum slot and batch-norm moving statistic that way, every step, so
persistent buffers wander into the middle of the arena and split the free
memory the next step's large tensors need: a step that fits in its first call
can run out of memory in its second.

`assign_in_place` turns each such assignment into a
`ResourceStridedSliceAssign` of the whole variable (`var[:] = value`), which
copies the value into the variable's own buffer: the same values bit for bit,
for one copy of the value's bytes. Like any sliced or scattered write, it puts
the variable in TensorFlow's copy-on-read mode, where each read allocates a copy
(`EnsureSparseVariableAccess`): reads of momentum slots would allocate copies
among the activations, chunks the simulator does not have. So a `DisableCopyOnRead` of the
variable follows each such assignment, and whatever waited on the assignment
waits on it: reads return the variable's own buffer again, as in the original
step.

An update (`AssignAddVariableOp`, `AssignSubVariableOp`) writes in place unless
its variable is in copy-on-read mode, which a sparse op puts it in (an
embedding's `ResourceGather`, every step): then it copies the variable to a new
buffer first, so an embedding moves every step and the step's peak with it.
So each update of a variable a sparse op reaches is preceded by a
`DisableCopyOnRead` of it (`<update>/seqmem_copy_on_read_off_before`), which
waits on the update's value and control inputs (and so on the gradient, after
the forward pass's sparse reads).

Every step seqmem rewrites gets both (`seqmem.runtime.optimized_step.build_step`):
the simulator counts a variable's buffer where it was allocated, and so does
the device now.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef
from seqmem.ir.op_tables import SPARSE_OP_PREFIXES, VARIABLE_UPDATE_OPS

__all__ = ["COPY_ON_READ_OFF_BEFORE_SUFFIX", "COPY_ON_READ_OFF_SUFFIX", "WHOLE_SLICE_PREFIX", "assign_in_place"]

WHOLE_SLICE_PREFIX = "seqmem_whole_slice"
COPY_ON_READ_OFF_SUFFIX = "seqmem_copy_on_read_off"
COPY_ON_READ_OFF_BEFORE_SUFFIX = "seqmem_copy_on_read_off_before"
_NUMERIC = ("float", "bfloat", "half", "double", "int", "uint", "complex", "bool")


def assign_in_place(graph: Graph) -> Graph:
    """`graph` with each assignment `_in_place_eligible` allows made a `ResourceStridedSliceAssign` of the
    whole variable (same name, inputs and control inputs; three shared constants added: the slice `[0:]`
    of the first dimension), followed by a `DisableCopyOnRead` of the variable (named
    `<assignment>/seqmem_copy_on_read_off`) in place of the assignment in every control edge from it; and
    each update of a variable in copy-on-read mode (`_copy_on_read_handles`) preceded by a
    `DisableCopyOnRead` of it (`<update>/seqmem_copy_on_read_off_before`), which waits on the update's
    value and control inputs. Unchanged when there is nothing to do."""
    read_shapes: dict[TensorRef, set] = {}
    for node in graph.nodes.values():
        if node.op == "ReadVariableOp" and node.inputs and node.outputs and node.outputs[0].shape is not None:
            read_shapes.setdefault(node.inputs[0], set()).add(node.outputs[0].shape)
    replaced = [name for name, node in graph.nodes.items() if _in_place_eligible(graph, node, read_shapes)]
    copy_on_read = _copy_on_read_handles(graph)
    updates = [name for name, node in graph.nodes.items()
               if node.op in VARIABLE_UPDATE_OPS and node.inputs and node.inputs[0] in copy_on_read]
    if not replaced and not updates:
        return graph
    begin, end, strides = (f"{WHOLE_SLICE_PREFIX}/{part}" for part in ("begin", "end", "strides"))
    nodes = []
    if replaced:
        device = graph.node(replaced[0]).device
        nodes += [_index_constant(begin, 0, device), _index_constant(end, 0, device),
                  _index_constant(strides, 1, device)]
    after = {name: f"{name}/{COPY_ON_READ_OFF_SUFFIX}" for name in replaced}
    before = {name: f"{name}/{COPY_ON_READ_OFF_BEFORE_SUFFIX}" for name in updates}
    for name, node in graph.nodes.items():
        if name in before:
            handle, value = node.inputs
            nodes.append(Node(before[name], "DisableCopyOnRead", inputs=(handle,),
                              control_inputs=tuple(dict.fromkeys((value.node, *node.control_inputs))),
                              device=node.device))
            node = dataclasses.replace(node, control_inputs=(*node.control_inputs, before[name]))
        if name in after:
            handle, value = node.inputs
            nodes.append(Node(after[name], "DisableCopyOnRead", inputs=(handle,), control_inputs=(name,),
                              device=node.device))
            node = dataclasses.replace(
                node, op="ResourceStridedSliceAssign",
                inputs=(handle, TensorRef(begin), TensorRef(end), TensorRef(strides), value),
                attrs=_slice_attrs(node.attrs["dtype"]))
        if any(control in after for control in node.control_inputs):
            node = dataclasses.replace(node, control_inputs=tuple(after.get(c, c) for c in node.control_inputs))
        nodes.append(node)
    return graph.replace(nodes=nodes)


def _copy_on_read_handles(graph: Graph) -> frozenset[TensorRef]:
    """Handles of the variables TensorFlow keeps in copy-on-read mode in `graph`'s step: those a sparse op
    of the graph reads, or whose reads are copies (`TensorInfo.copies_input`: a sparse op reaches them in a
    called function)."""
    handles = set()
    for node in graph.nodes.values():
        if node.inputs and (node.op.startswith(SPARSE_OP_PREFIXES) or (
                node.op == "ReadVariableOp" and node.outputs and node.outputs[0].copies_input)):
            handles.add(node.inputs[0])
    return frozenset(handles)


def _in_place_eligible(graph: Graph, node: Node, read_shapes: dict[TensorRef, set]) -> bool:
    """Whether `node` is an `AssignVariableOp` of a variable the graph does not create (its handle is not a
    `VarHandleOp` of the graph: a TF1 initializer creates the variable it assigns) and of a numeric value
    whose static shape is known, of rank 1 or more, and equal to that of a `ReadVariableOp` of the same
    variable (`read_shapes`: the shapes read, by handle)."""
    if node.op != "AssignVariableOp" or len(node.inputs) != 2 or "dtype" not in node.attrs:
        return False
    handle, value = node.inputs
    info = graph.tensor(value)
    return (graph.node(handle.node).op != "VarHandleOp" and info.dtype.startswith(_NUMERIC)
            and bool(info.shape) and None not in info.shape and info.shape in read_shapes.get(handle, ()))


def _index_constant(name: str, value: int, device: str) -> Node:
    tensor = tf.make_tensor_proto([value], dtype=tf.int32)
    return Node(name, "Const", outputs=(TensorInfo("int32", (1,), 4),), device=device,
                attrs={"dtype": attr_value_pb2.AttrValue(type=tf.int32.as_datatype_enum),
                       "value": attr_value_pb2.AttrValue(tensor=tensor)})


def _slice_attrs(dtype) -> dict:
    """`ResourceStridedSliceAssign`'s attributes for `var[:] = value`: the first dimension whole (begin and
    end masked), the others implied."""
    mask = attr_value_pb2.AttrValue(i=1)
    none = attr_value_pb2.AttrValue(i=0)
    return {"T": dtype, "Index": attr_value_pb2.AttrValue(type=tf.int32.as_datatype_enum),
            "begin_mask": mask, "end_mask": mask, "ellipsis_mask": none, "new_axis_mask": none,
            "shrink_axis_mask": none}
