"""Swap the activations a loop saves for its gradient to host memory, element by element (emulated device).

A forward `While` saves what its gradient `While` reads in TensorList
accumulators: an `EmptyTensorList` outside the loops, one `TensorListPushBack`
per iteration in the forward body, one `TensorListPopBack` per iteration in the
gradient body. A swapped accumulator holds serialized host buffers instead:

    before:  EmptyTensorList(float, [B, H]) ─> forward: PushBack(list, x)                  ─> gradient: y = PopBack(list)
    after:   EmptyTensorList(string, [])   ─> forward: PushBack(list, SerializeTensor(x)) ─> gradient: y = EnsureShape(ParseTensor(PopBack(list)))

On the emulated device `SerializeTensor` keeps its payload outside the bounded
arena, so the list holds no device memory, and the gradient loop parses each
element back as it reaches it (one at a time with the loops bounded, see
`seqmem.edge.loops`). The bodies are edited in renamed copies
(`seqmem.edge.library`).

Candidates (`loop_accumulators`): loops in the graph itself (tfa's decoders, a
`tf.while_loop` in the step; not loops inside called functions, such as Keras'
LSTM), float accumulators whose pushed value is computed in the loop (a
variable read shares the variable's buffer: swapping it frees nothing), whose
forward loop output feeds only one gradient loop, which only pops from it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2

from seqmem.edge import library
from seqmem.ir.op_tables import FUNCTIONAL_LOOP_OPS
from seqmem.swap.plan import LoopSwap

__all__ = ["loop_accumulators", "swap_loop_accumulators"]

_FLOAT_TYPES = frozenset({tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum,
                          tf.float64.as_datatype_enum})
_SUFFIX = "_seqmem_swapped"


def loop_accumulators(graph_def: graph_pb2.GraphDef) -> list[LoopSwap]:
    """The accumulators of `graph_def`'s loops that can be swapped (see the module docstring)."""
    nodes = {n.name: n for n in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    readers: dict[str, list[tuple[str, int]]] = {}  # "node:index" -> [(reader, input position)]
    for node in graph_def.node:
        for position, name in enumerate(node.input):
            readers.setdefault(_tensor(name), []).append((node.name, position))
    found = []
    for forward in graph_def.node:
        if forward.op not in FUNCTIONAL_LOOP_OPS:
            continue
        body = functions.get(forward.attr["body"].func.name)
        if body is None:  # a body outside the graph's library: nothing to edit
            continue
        for index, name in enumerate(forward.input):
            source = nodes.get(_tensor(name).rsplit(":", 1)[0])
            if source is None or source.op != "EmptyTensorList" or _tensor(name) != f"{source.name}:0":
                continue
            if source.attr["element_dtype"].type not in _FLOAT_TYPES or not _pushes_a_computed_value(body, index):
                continue
            gradient = readers.get(f"{forward.name}:{index}", [])
            if len(gradient) != 1 or nodes[gradient[0][0]].op not in FUNCTIONAL_LOOP_OPS:
                continue
            gradient_loop, gradient_index = gradient[0]
            gradient_body = functions.get(nodes[gradient_loop].attr["body"].func.name)
            if gradient_body is None or not _pops(gradient_body, gradient_index):
                continue
            shape = _element_shape(nodes, source)
            dtype = tf.dtypes.as_dtype(source.attr["element_dtype"].type)
            known = shape is not None and None not in shape
            found.append(LoopSwap(source.name, forward.name, index, gradient_loop, gradient_index, dtype.name, shape,
                                  int(np.prod(shape, dtype=np.int64)) * dtype.size if known else None))
    return found


def swap_loop_accumulators(graph_def: graph_pb2.GraphDef, swaps: Sequence[LoopSwap]) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each of `swaps` (from `loop_accumulators`) holds host buffers.
    Raises ValueError for a swap that is not among the graph's candidates."""
    candidates = set(loop_accumulators(graph_def))
    unknown = [swap.accumulator for swap in swaps if swap not in candidates]
    if unknown:
        raise ValueError(f"not swappable loop accumulators of this graph: {unknown}; take them from loop_accumulators()")
    swapped = graph_pb2.GraphDef()
    swapped.CopyFrom(graph_def)
    if not swaps:
        return swapped
    nodes = {n.name: n for n in swapped.node}
    functions = {f.signature.name: f for f in swapped.library.function}
    edited = set()
    for swap in swaps:
        dtype = tf.as_dtype(swap.dtype).as_datatype_enum
        accumulator = nodes[swap.accumulator]
        accumulator.attr["element_dtype"].type = tf.string.as_datatype_enum
        shape_name = f"{swap.accumulator}/seqmem_scalar_shape"
        swapped.node.append(_scalar_shape_const(shape_name, accumulator.device))
        accumulator.input[0] = shape_name
        forward_body = functions[nodes[swap.forward_loop].attr["body"].func.name]
        _serialize_pushes(forward_body, swap.forward_index, dtype)
        gradient_body = functions[nodes[swap.gradient_loop].attr["body"].func.name]
        _parse_pops(gradient_body, swap.gradient_index, dtype, swap.element_shape)
        edited |= {forward_body.signature.name, gradient_body.signature.name}
    renamed = library.copies_for(swapped.library, edited, _SUFFIX)
    library.rename_functions(swapped.library, renamed)
    library.follow_copies(swapped.node, renamed)
    return swapped


def _tensor(name: str) -> str:
    """A GraphDef input as "node:index" (control inputs keep their "^")."""
    return name if name.startswith("^") or ":" in name else f"{name}:0"


def _pushes_a_computed_value(body: function_pb2.FunctionDef, index: int) -> bool:
    push = _push(body, index)
    if push is None:
        return False
    producer = next((n for n in body.node_def if n.name == push.input[1].split(":")[0]), None)
    return producer is None or producer.op != "ReadVariableOp"  # None: a loop variable, computed last iteration


def _push(body: function_pb2.FunctionDef, index: int) -> node_def_pb2.NodeDef | None:
    """The PushBack that makes loop output `index` from loop input `index`, if that is what it is."""
    returned = body.ret[body.signature.output_arg[index].name].split(":")[0]
    push = next((n for n in body.node_def if n.name == returned), None)
    if push is None or push.op != "TensorListPushBack" or push.input[0] != body.signature.input_arg[index].name:
        return None
    return push


def _pops(body: function_pb2.FunctionDef, index: int) -> list[node_def_pb2.NodeDef] | None:
    """The PopBacks reading loop input `index`, when nothing else reads it (None otherwise)."""
    arg = body.signature.input_arg[index].name
    readers = [n for n in body.node_def if any(i == arg or i.startswith(arg + ":") for i in n.input)]
    returned = any(value == arg for value in body.ret.values())
    if returned or not readers or any(n.op != "TensorListPopBack" or n.input[0] != arg for n in readers):
        return None
    return readers


def _element_shape(nodes: dict[str, node_def_pb2.NodeDef],
                   accumulator: node_def_pb2.NodeDef) -> tuple[int | None, ...] | None:
    const = nodes.get(accumulator.input[0].split(":")[0])
    if const is None or const.op != "Const":
        return None
    dims = tf.make_ndarray(const.attr["value"].tensor)
    if dims.ndim == 0:  # -1: rank unknown
        return None
    return tuple(int(d) if d >= 0 else None for d in dims)


def _scalar_shape_const(name: str, device: str) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Const", device=device)
    node.attr["dtype"].type = tf.int32.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.zeros([0], np.int32)))
    return node


def _serialize_pushes(body: function_pb2.FunctionDef, index: int, dtype: int) -> None:
    push = _push(body, index)
    serialize = body.node_def.add(name=f"{push.name}/seqmem_serialize", op="SerializeTensor", input=[push.input[1]])
    serialize.attr["T"].type = dtype
    push.input[1] = f"{serialize.name}:serialized:0"
    push.attr["element_dtype"].type = tf.string.as_datatype_enum


def _parse_pops(body: function_pb2.FunctionDef, index: int, dtype: int, shape: tuple[int | None, ...] | None) -> None:
    for pop in _pops(body, index):
        element = f"{pop.name}:tensor:0"
        shape_const = _scalar_shape_const(f"{pop.name}/seqmem_scalar_shape", pop.device)
        body.node_def.append(shape_const)
        pop.input[1] = f"{shape_const.name}:output:0"
        pop.attr["element_dtype"].type = tf.string.as_datatype_enum
        parse = body.node_def.add(name=f"{pop.name}/seqmem_parse", op="ParseTensor", input=[element])
        parse.attr["out_type"].type = dtype
        restore = body.node_def.add(name=f"{pop.name}/seqmem_restore", op="EnsureShape",
                                    input=[f"{parse.name}:output:0"])
        restore.attr["T"].type = dtype
        restore.attr["shape"].CopyFrom(attr_value_pb2.AttrValue(shape=tf.TensorShape(
            None if shape is None else list(shape)).as_proto()))
        restored = f"{restore.name}:output:0"
        for node in body.node_def:
            if node.name != parse.name:
                node.input[:] = [restored if name == element else name for name in node.input]
        for key, value in list(body.ret.items()):
            if value == element:
                body.ret[key] = restored
