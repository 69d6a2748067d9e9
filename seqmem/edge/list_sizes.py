"""Sizes of TensorList variants (a loop's accumulators, a TensorArray), followed back to where each list was made.

A variant's size is not in its static shape: `ListSizer` follows the list back
through identities, loops and function calls to the op that made it (an empty
list a loop fills, a list made from a tensor's rows, a reserved list), and
sizes it from the elements written to it and the loop's trip count: a constant
bound in the loop's condition (`constant_trip_count`), else one measured
(`seqmem.runtime.trip_counts`, for the loops `unbounded_loops` lists). Each
element is a buffer of its own, except where a loop pushes to an accumulator
buffers it pushes to another accumulator too (the same value, a view of it,
or a loop variable's previous value: counted in the first only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction

from seqmem.edge.library import FunctionBodies
from seqmem.edge.sizes import static_bytes
from seqmem.ir.graph import loop_value_buffer
from seqmem.ir.op_tables import (FUNCTION_CALL_OPS, FUNCTIONAL_LOOP_OPS, LIST_PASSTHROUGH_OPS, LIST_WRITE_OPS,
                                 SHARED_ELEMENT_OPS, VIEW_OPS)

__all__ = ["ListSizer", "constant_trip_count", "list_uses", "unbounded_loops"]

_MAX_VARIANT_DEPTH = 64


class ListSizer:
    """Sizes TensorList variants by following them back to where the list was made."""

    def __init__(self, bodies: FunctionBodies, graph: Optional[tf.Graph] = None,
                 shapes: Optional[Mapping[str, tf.TensorShape]] = None,
                 trip_counts: Optional[Mapping[str, int]] = None) -> None:
        """shapes: refined static shapes of `graph`'s tensors, by name (`stacked_shapes`); trip_counts: as
        `from_tf`'s, for `graph`'s loops."""
        self._bodies = bodies
        self._graph = graph
        self._shapes = shapes or {}
        self._trip_counts = trip_counts or {}
        self._sharing: dict[str, frozenset[int]] = {}  # `_lists_sharing_elements`, by loop

    def _shape(self, tensor: tf.Tensor) -> tf.TensorShape:
        return self._shapes.get(tensor.name, tensor.shape) if tensor.graph is self._graph else tensor.shape

    def size(self, tensor: tf.Tensor) -> tuple[int, int | None] | None:
        """(bytes the list `tensor` holds, bytes of each of its elements (None when it holds none)), or None
        when unknown."""
        return self._size(tensor, (), None, 0)

    def length(self, tensor: tf.Tensor) -> int | None:
        """Elements the list `tensor` holds, or None when unknown."""
        size = self.size(tensor)
        return None if size is None or not size[1] else size[0] // size[1]

    def _size(self, tensor: tf.Tensor, callers: tuple, trip_count: int | None, depth: int,
              filled: bool = False, written: tf.TensorShape = tf.TensorShape(None)) -> tuple[int, int | None] | None:
        """As `size`; `filled`: the list leaves a loop that grows it, at most `trip_count` times, writing
        elements of shape `written` (as far as the loop's body knows it)."""
        if depth > _MAX_VARIANT_DEPTH:
            return None
        op = tensor.op
        index = tensor.value_index
        recurse = lambda t: self._size(t, callers, trip_count, depth + 1, filled, written)  # noqa: E731
        if op.type in ("EmptyTensorList", "TensorListReserve"):
            # a new list holds no element buffers; a loop fills it (trip_count given by FUNCTIONAL_LOOP_OPS)
            return self._list_bytes(op, trip_count, written) if filled else (0, None)
        if op.type == "TensorListFromTensor":
            return _unstacked_bytes(op.inputs[0].dtype, self._shape(op.inputs[0]))
        if op.type in LIST_PASSTHROUGH_OPS or op.type in ("Identity", "Snapshot", "ZerosLike"):
            return recurse(op.inputs[0])  # ZerosLike: a new list, of zeros as large as its input's elements
        if op.type == "IdentityN":
            return recurse(op.inputs[index]) if index < len(op.inputs) else None
        if op.type in FUNCTIONAL_LOOP_OPS:
            if index >= len(op.inputs):
                return None
            popped, written = list_uses(op, index, self._bodies)
            if popped:
                return 0, None  # a gradient loop consuming saved activations: the list leaves it empty
            if written and all(value.op.type in SHARED_ELEMENT_OPS for value in written):
                return 0, None  # elements that share another buffer: a list's elements, a variable's value
            if index in self._lists_sharing_elements(op):
                return 0, None  # the buffers another of the loop's lists holds (counted there)
            return self._size(op.inputs[index], callers, self._trip_count(op), depth + 1, filled=True,
                              written=_common_shape(value.shape for value in written))
        if op.type in FUNCTION_CALL_OPS:
            body = self._bodies.get(op.get_attr("f").name)
            if body is None or index >= len(body.outputs):
                return None
            return self._size(body.outputs[index], callers + ((op, body),), trip_count, depth + 1, filled,
                              written)
        if op.type == "Placeholder" and callers:
            call_op, body = callers[-1]
            arguments = [t.op for t in body.inputs]
            if op not in arguments or arguments.index(op) >= len(call_op.inputs):
                return None
            return self._size(call_op.inputs[arguments.index(op)], callers[:-1], trip_count, depth + 1, filled,
                              written)
        return None

    def _lists_sharing_elements(self, loop: tf.Operation) -> frozenset[int]:
        """Loop variables whose list is an accumulator (only pushed to, as a gradient's saved activations
        are) holding only buffers that an accumulator of a lower index holds too.

        A pushed value is followed back through views (`VIEW_OPS`) and, from a loop variable, to what the
        previous iteration returned for it: a decoder pushes its cell's output `h` to one accumulator and,
        next iteration, the loop variable `h` to another, and pushes the attention's `ExpandDims` of a
        softmax beside the softmax. Each buffer is counted in the first accumulator pushing it; all of them
        live until the gradient loop pops them. A TensorArray (written with `TensorListSetItem`) is left
        out: stacked and dropped after its loop, it holds its buffers for less time than an accumulator,
        which counts them too. The first iteration's value of a loop variable is left out (one element of
        the list). `seqmem.edge.loop_swap` follows a pushed value the same way in a FunctionDef
        (`LoopSwap.buffer`), to swap such lists together; both use `ir.graph.loop_value_buffer`."""
        if loop.name not in self._sharing:
            body = self._bodies.get(loop.get_attr("body").name)
            shared, seen = set(), set()
            for index, variable in enumerate(body.inputs if body is not None else ()):
                writes = [c for c in variable.consumers()
                          if c.type in LIST_WRITE_OPS and c.inputs[0].name == variable.name]
                if not writes or any(c.type != "TensorListPushBack" for c in writes):
                    continue
                buffers = {_element_buffer(body, c.inputs[LIST_WRITE_OPS[c.type]]) for c in writes}
                if buffers <= seen:
                    shared.add(index)
                seen |= buffers
            self._sharing[loop.name] = frozenset(shared)
        return self._sharing[loop.name]

    def _trip_count(self, loop: tf.Operation) -> int | None:
        """Iterations of a While loop: its constant bound (`constant_trip_count`), else the trip count given
        for a loop of the graph itself (`from_tf`'s `trip_counts`)."""
        bound = constant_trip_count(loop, self._bodies)
        if bound is None and loop.graph is self._graph:
            return self._trip_counts.get(loop.name)
        return bound

    @staticmethod
    def _list_bytes(op: tf.Operation, trip_count: int | None, written: tf.TensorShape) -> tuple[int, int] | None:
        """(bytes, bytes per element) of the list `op` makes once a loop of `trip_count` iterations filled it
        with elements of shape `written` (which completes what the list's element shape leaves unknown)."""
        element_shape = _static_value(op.inputs[0])
        count = _static_value(op.inputs[1])
        if count is None:
            return None
        count = int(count)
        if count <= 0:  # unbounded, or a TensorArray of dynamic size: grown once per iteration of the loop
            if trip_count is None:
                return None
            count = trip_count
        elif trip_count is not None:
            count = min(count, trip_count)
        shape = tf.TensorShape(None)
        if element_shape is not None and np.ndim(element_shape) == 1:  # a scalar -1: rank unknown
            shape = tf.TensorShape([int(d) if d >= 0 else None for d in element_shape])
        if not shape.is_compatible_with(written):
            return None
        element_bytes = static_bytes(op.get_attr("element_dtype"), shape.merge_with(written))
        return None if element_bytes is None else (count * element_bytes, element_bytes)


def list_uses(loop: tf.Operation, index: int, bodies: FunctionBodies) -> tuple[bool, list[tf.Tensor]]:
    """For loop variable `index`: whether the body pops from it (TensorListPopBack), and the values it
    writes to it (TensorListPushBack, TensorListSetItem: a TensorArray's write).

    A loop that pops the list (a gradient loop consuming the forward loop's saved activations)
    empties it; one that pushes a variable's value each iteration (ReadVariableOp: the variable's
    buffer) or elements of another list (TensorListGetItem, a Keras RNN saving its inputs) holds no
    buffer of its own.
    """
    body = bodies.get(loop.get_attr("body").name)
    if body is None or index >= len(body.inputs):
        return False, []
    popped, written = False, []
    variable = body.inputs[index]
    for consumer in variable.consumers():
        if consumer.inputs[0].name != variable.name:  # reads the variable otherwise than as its list
            continue
        if consumer.type == "TensorListPopBack":
            popped = True
        elif consumer.type in LIST_WRITE_OPS:
            written.append(consumer.inputs[LIST_WRITE_OPS[consumer.type]])
    return popped, written



def constant_trip_count(loop: tf.Operation, bodies: FunctionBodies) -> int | None:
    """Iterations of a While loop whose condition compares a counter with a constant: the smallest bound
    `c` of a `Less(x, c)` (or `c + 1` of `LessEqual`) in the condition, where `c` is a constant in the
    condition or a constant loop input; None when there is none (a loop that runs until its data says so,
    as a tfa decoder without `maximum_iterations`)."""
    cond = bodies.get(loop.get_attr("cond").name)
    if cond is None:
        return None
    arguments = [t.op for t in cond.inputs]
    bounds = []
    for op in cond.get_operations():
        if op.type not in ("Less", "LessEqual"):
            continue
        limit = op.inputs[1]
        value = _static_value(limit)
        if value is None and limit.op in arguments:
            position = arguments.index(limit.op)
            value = _static_value(loop.inputs[position]) if position < len(loop.inputs) else None
        if value is not None and np.ndim(value) == 0 and int(value) >= 0:
            bounds.append(int(value) + (op.type == "LessEqual"))
    return min(bounds) if bounds else None


def unbounded_loops(function: ConcreteFunction) -> list[str]:
    """The forward while loops of `function`'s own graph (not of its bodies) without a constant trip count.
    A gradient loop (one whose body pops a list: the activations its forward loop saved) is left out: it
    runs as many iterations as its forward loop pushed, and the lists it leaves are empty."""
    graph = function.graph
    loops = [op for op in graph.get_operations() if op.type in FUNCTIONAL_LOOP_OPS]
    if not loops:
        return []
    bodies = FunctionBodies(graph.as_graph_def().library)

    def pops(loop: tf.Operation) -> bool:
        body = bodies.get(loop.get_attr("body").name)
        return body is not None and any(op.type == "TensorListPopBack" for op in body.get_operations())

    return [op.name for op in loops if constant_trip_count(op, bodies) is None and not pops(op)]


def _element_buffer(body: tf.Graph, value: tf.Tensor) -> str:
    """The name of the body tensor whose buffer `value` (written to a list in loop body `body`) is: followed
    back through views and, from a loop variable, to the body's output for it (the previous iteration's)."""
    returned = {argument.name: output.name for argument, output in zip(body.inputs, body.outputs)}

    def view_input(name: str) -> Optional[str]:
        tensor = body.get_tensor_by_name(name)
        if tensor.op.type not in VIEW_OPS:
            return None
        return tensor.op.inputs[tensor.value_index if tensor.op.type == "IdentityN" else 0].name

    return loop_value_buffer(value.name, returned, view_input)


def _common_shape(shapes) -> tf.TensorShape:
    """What `shapes` (static shapes of values written to one list) agree on; unknown where they differ."""
    common = None
    for shape in shapes:
        common = shape if common is None else common.most_specific_compatible_shape(shape)
    return tf.TensorShape(None) if common is None else common


def _unstacked_bytes(dtype: tf.DType, shape: tf.TensorShape) -> tuple[int, int | None] | None:
    """(bytes, bytes per element) of a list made from the rows of a tensor of `dtype` and `shape`
    (TensorListFromTensor)."""
    size = static_bytes(dtype, shape)
    if size is None:
        return None
    rows = shape[0] if shape.rank else 0
    return size, (size // rows if rows else None)


def _static_value(tensor: tf.Tensor):
    """The value of a graph tensor computable from constants, or None.

    Extends tf.get_static_value with StridedSlice of constants (how loop bounds
    such as a sequence length are usually spelled).
    """
    value = tf.get_static_value(tensor)
    op = tensor.op
    if value is not None or op.type != "StridedSlice":
        return value
    inputs = [tf.get_static_value(t) for t in op.inputs]
    if any(v is None for v in inputs):
        return None
    masks = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")
    return tf.raw_ops.StridedSlice(
        input=inputs[0], begin=inputs[1], end=inputs[2], strides=inputs[3], **{m: op.get_attr(m) for m in masks}
    ).numpy()
