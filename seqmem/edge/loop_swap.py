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
(`seqmem.edge.library`), named for the set of accumulators swapped.

Candidates (`loop_accumulators`): loops in the graph (tfa's decoders, a
`tf.while_loop` in the step) and loops inside called functions (Keras' LSTM and
GRU run theirs in a function whose outputs include the lists, read by the
function that runs the gradient loop), float accumulators whose pushed value is
computed in the loop (a variable read shares the variable's buffer: swapping it
frees nothing), whose list reaches exactly one gradient loop, which only pops
from it, through no other reader on the way. Every function on that way must be
called from one place only, so that editing it changes nothing else.

`with_popped_shapes` states, in a copy, the element shape of what each gradient
body pops (of any type: a mask's booleans too), which TensorFlow's shape
inference does not carry into the body: otherwise everything the gradient body
computes from a popped element has an unknown shape, and no size.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2

from seqmem.edge import library
from seqmem.ir.graph import loop_value_buffer
from seqmem.ir.op_tables import FUNCTION_CALL_OPS, FUNCTIONAL_LOOP_OPS, VIEW_OPS
from seqmem.decisions.plan import LoopSwap

__all__ = ["loop_accumulators", "swap_loop_accumulators", "with_popped_shapes"]

_FLOAT_TYPES = frozenset({tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum,
                          tf.float64.as_datatype_enum})


class _Scope:
    """The nodes of the graph (`function` None) or of one library function, and how they name tensors:
    "node:index" in a graph, "node:output_arg:index" in a function (a While's or a call's outputs are its
    "output" list), a function argument by its name."""

    def __init__(self, nodes: Sequence[node_def_pb2.NodeDef], function: Optional[function_pb2.FunctionDef] = None):
        self.function = function
        self.nodes = {n.name: n for n in nodes}
        self._readers: dict[str, list[tuple[node_def_pb2.NodeDef, int]]] = {}
        for node in nodes:
            for position, name in enumerate(node.input):
                self._readers.setdefault(self.canonical(name), []).append((node, position))

    def canonical(self, name: str) -> str:
        return name if self.function is not None or name.startswith("^") or ":" in name else f"{name}:0"

    def output(self, node: node_def_pb2.NodeDef, index: int) -> str:
        return f"{node.name}:{index}" if self.function is None else f"{node.name}:output:{index}"

    def producer(self, name: str) -> tuple[Optional[node_def_pb2.NodeDef], int]:
        """The node making tensor `name` and its index in the node's output arg (None for an argument)."""
        parts = self.canonical(name).split(":")
        return (self.nodes.get(parts[0]), int(parts[-1])) if len(parts) > 1 else (None, 0)

    def readers(self, name: str) -> list[tuple[node_def_pb2.NodeDef, int]]:
        """(node, input position) of every node reading tensor `name`, and (None, -1) per function output."""
        returned = [] if self.function is None else [(None, -1) for v in self.function.ret.values() if v == name]
        return self._readers.get(self.canonical(name), []) + returned

    def add(self, node: node_def_pb2.NodeDef, graph_def: graph_pb2.GraphDef) -> str:
        """Add `node` to this scope (of `graph_def`); the name of its first output."""
        (graph_def.node if self.function is None else self.function.node_def).append(node)
        return self.output(node, 0)


@dataclass
class _Accumulator:
    """Where one candidate is made and filled (`scope`, `source`, the forward loop's `body` at `forward_index`)
    and emptied (the gradient loop's `gradient_body` at `gradient_index`)."""

    swap: LoopSwap
    scope: _Scope
    source: node_def_pb2.NodeDef
    body: function_pb2.FunctionDef
    forward_index: int
    gradient_body: function_pb2.FunctionDef
    gradient_index: int

    def functions(self) -> set[str]:
        """The functions the rewrite edits."""
        edited = {self.body.signature.name, self.gradient_body.signature.name}
        return edited | ({self.scope.function.signature.name} if self.scope.function is not None else set())


def loop_accumulators(graph_def: graph_pb2.GraphDef) -> list[LoopSwap]:
    """The accumulators of `graph_def`'s loops that can be swapped (see the module docstring)."""
    return [found.swap for found in _accumulators(graph_def)]


def with_popped_shapes(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each gradient loop's PopBack of an accumulator with a fully known
    element shape states that shape (`_output_shapes`, which importing the body applies), variable reads'
    accumulators and those of any element type included. For sizing the gradient bodies
    (`seqmem.edge.bodies`); the copy is not run."""
    shaped = graph_pb2.GraphDef()
    shaped.CopyFrom(graph_def)
    for candidate in _accumulators(shaped, computed_only=False, floats_only=False):
        shape = candidate.swap.element_shape
        if shape is None or None in shape:
            continue
        for pop in _pops(candidate.gradient_body, candidate.gradient_index):
            shapes = pop.attr["_output_shapes"].list.shape
            del shapes[:]
            shapes.extend([tf.TensorShape([]).as_proto(), tf.TensorShape(list(shape)).as_proto()])  # list, element
    return shaped


def swap_loop_accumulators(graph_def: graph_pb2.GraphDef, swaps: Sequence[LoopSwap]) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each of `swaps` (from `loop_accumulators`) holds host buffers.
    Raises ValueError for a swap that is not among the graph's candidates."""
    swapped = graph_pb2.GraphDef()
    swapped.CopyFrom(graph_def)
    found = {candidate.swap: candidate for candidate in _accumulators(swapped)}
    unknown = [swap.accumulator for swap in swaps if swap not in found]
    if unknown:
        raise ValueError(f"not swappable loop accumulators of this graph: {unknown}; take them from loop_accumulators()")
    if not swaps:
        return swapped
    edited = set()
    for swap in swaps:
        candidate = found[swap]
        dtype = tf.as_dtype(swap.dtype).as_datatype_enum
        candidate.source.attr["element_dtype"].type = tf.string.as_datatype_enum
        shape = _scalar_shape_const(f"{candidate.source.name}/seqmem_scalar_shape", candidate.source.device)
        candidate.source.input[0] = candidate.scope.add(shape, swapped)
        _serialize_pushes(candidate.body, candidate.forward_index, dtype)
        _parse_pops(candidate.gradient_body, candidate.gradient_index, dtype, swap.element_shape)
        edited |= candidate.functions()
    library.use_copies(swapped, edited, _copy_suffix(swaps))
    return swapped


def _copy_suffix(swaps: Sequence[LoopSwap]) -> str:
    """The suffix of the edited functions' copies: it names the set of accumulators swapped, since a
    process cannot hold two different functions of one name (re-planning swaps another set of a loop's
    lists, so its copies must not take the names of the first plan's)."""
    digest = hashlib.sha1("\n".join(sorted(swap.accumulator for swap in swaps)).encode()).hexdigest()[:10]
    return f"_seqmem_swapped_{digest}"


def _accumulators(graph_def: graph_pb2.GraphDef, computed_only: bool = True,
                  floats_only: bool = True) -> list[_Accumulator]:
    """Every candidate, with the nodes of `graph_def` that make, fill and empty it; with `computed_only`
    False, also the accumulators of variable reads; with `floats_only` False, also those of other element
    types (a mask's booleans)."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    calls = Counter(name for n in [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
                    for name in library.called_functions(n) if name in functions)
    once = {name for name, count in calls.items() if count == 1}
    graph = _Scope(graph_def.node)
    found = []
    for node in graph_def.node:
        if node.op not in FUNCTIONAL_LOOP_OPS | FUNCTION_CALL_OPS:
            continue
        types = node.attr["T" if node.op in FUNCTIONAL_LOOP_OPS else "Tout"].list.type
        for index in (i for i, t in enumerate(types) if t == tf.variant.as_datatype_enum):
            filled = _filled(graph, node, index, functions, once, computed_only, floats_only)
            readers = graph.readers(graph.output(node, index))
            emptied = _emptied(graph, readers, functions, once)
            if filled is None or emptied is None:
                continue
            scope, source, body, forward_index, accumulator = filled
            (gradient_body, gradient_index), (gradient_loop, gradient_position) = emptied, readers[0]
            shape = _element_shape(scope, source)
            dtype = tf.dtypes.as_dtype(source.attr["element_dtype"].type)
            known = shape is not None and None not in shape
            swap = LoopSwap(accumulator, node.name, index, gradient_loop.name, gradient_position, dtype.name, shape,
                            int(np.prod(shape, dtype=np.int64)) * dtype.size if known else None,
                            _pushed_buffer(body, forward_index))
            found.append(_Accumulator(swap, scope, source, body, forward_index, gradient_body, gradient_index))
    return found


def _filled(scope: _Scope, node: node_def_pb2.NodeDef, index: int, functions: dict[str, function_pb2.FunctionDef],
            once: set[str], computed_only: bool, floats_only: bool, prefix: str = ""):
    """(scope, EmptyTensorList, loop body, loop index, accumulator's name) of the list `node` outputs at
    `index`: a loop filling a list (of floats, with `floats_only`) it starts empty, or a call (called once)
    returning such a list once and nothing else reading it; None otherwise. A list made inside called
    functions is named by the calls' path, e.g. "sequential/lstm/PartitionedCall/while/Tanh_0/accumulator"."""
    if node.op in FUNCTIONAL_LOOP_OPS:
        body = functions.get(node.attr["body"].func.name)
        source, output = scope.producer(node.input[index])
        if (body is None or body.signature.name not in once or source is None or source.op != "EmptyTensorList"
                or output != 0 or (floats_only and source.attr["element_dtype"].type not in _FLOAT_TYPES)
                or _push(body, index) is None or (computed_only and not _pushes_a_computed_value(body, index))):
            return None
        return scope, source, body, index, prefix + source.name
    function = _called_once(node, functions, once)
    if function is None:
        return None
    inner = _Scope(function.node_def, function)
    returned = function.ret[function.signature.output_arg[index].name]
    producer, output = inner.producer(returned)
    if producer is None or len(inner.readers(returned)) != 1:
        return None
    return _filled(inner, producer, output, functions, once, computed_only, floats_only, f"{prefix}{node.name}/")


def _emptied(scope: _Scope, readers: list, functions: dict[str, function_pb2.FunctionDef], once: set[str]):
    """(gradient loop body, its index) of the one loop that `readers` (of a list) lead to, through calls
    (called once) that pass the list on to that loop alone; None otherwise."""
    if len(readers) != 1 or readers[0][0] is None:
        return None
    node, position = readers[0]
    if node.op in FUNCTIONAL_LOOP_OPS:
        body = functions.get(node.attr["body"].func.name)
        if body is None or body.signature.name not in once or _pops(body, position) is None:
            return None
        return body, position
    function = _called_once(node, functions, once)
    if function is None:
        return None
    inner = _Scope(function.node_def, function)
    return _emptied(inner, inner.readers(function.signature.input_arg[position].name), functions, once)


def _called_once(node: node_def_pb2.NodeDef, functions: dict[str, function_pb2.FunctionDef],
                 once: set[str]) -> Optional[function_pb2.FunctionDef]:
    """The function `node` calls, if it is a call of a library function called from nowhere else."""
    if node.op not in FUNCTION_CALL_OPS or node.attr["f"].func.name not in once:
        return None
    return functions[node.attr["f"].func.name]


def _pushes_a_computed_value(body: function_pb2.FunctionDef, index: int) -> bool:
    push = _push(body, index)
    if push is None:
        return False
    producer = next((n for n in body.node_def if n.name == push.input[1].split(":")[0]), None)
    return producer is None or producer.op != "ReadVariableOp"  # None: a loop variable, computed last iteration


def _pushed_buffer(body: function_pb2.FunctionDef, index: int) -> str:
    """The body tensor whose buffer loop output `index`'s PushBack saves: its pushed value followed back
    through views (`VIEW_OPS`) and through loop variables to the value the previous iteration returned."""
    nodes = {n.name: n for n in body.node_def}
    returned = {argument.name: body.ret[output.name]
                for argument, output in zip(body.signature.input_arg, body.signature.output_arg)}

    def view_input(name: str) -> Optional[str]:
        node = nodes.get(name.split(":")[0])
        if node is None or node.op not in VIEW_OPS:
            return None
        return node.input[int(name.split(":")[-1]) if node.op == "IdentityN" else 0]

    return loop_value_buffer(_push(body, index).input[1], returned, view_input)


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


def _element_shape(scope: _Scope, accumulator: node_def_pb2.NodeDef) -> tuple[int | None, ...] | None:
    const, _ = scope.producer(accumulator.input[0])
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
