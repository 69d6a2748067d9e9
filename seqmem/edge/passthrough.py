"""Outputs that are one of their op's inputs: returned unchanged by a function call or a while loop, or
transposed without moving data.

A Keras LSTM's forward function returns the weights it read (for its backward
function) through its loop, where they are loop invariants: the body returns
its argument as it got it. TensorFlow passes such a tensor along without a copy,
so the output shares the input's buffer (a variable's, for a weight read). The
simulator sees a call or a loop as one node and would count each such output
as a new buffer, which no step allocates.

An output passes input `i` through when the function's (or the loop body's)
return value traces back to argument `i` through identities (Identity,
IdentityN, Snapshot), loop invariants and the same of nested calls.

TensorFlow's Transpose kernel moves no data when the permutation keeps every
dimension longer than 1 in order (an identity permutation included): its output
is its input's buffer, reshaped (`TransposeOp::Compute`). A gradient through a
gather transposes with such a permutation (`transposes_in_place`): in a Keras
Transformer's loss gradient, a [tokens, vocabulary] buffer no step allocates.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from seqmem.edge.folded_constants import folded_value
from seqmem.edge.library import FunctionBodies
from seqmem.ir.op_tables import FUNCTIONAL_LOOP_OPS, FUNCTION_CALL_OPS, PASSTHROUGH_IDENTITY_OPS

__all__ = ["passed_through_inputs", "transposes_in_place"]



def passed_through_inputs(tf_graph: tf.Graph, bodies: FunctionBodies) -> dict[str, dict[int, int]]:
    """For each call and while loop among `tf_graph`'s own ops whose function is in `bodies`, by op name:
    {output index: index of the input it returns unchanged}; ops with no such output are left out."""
    tracer = _Tracer(bodies)
    result = {}
    for op in tf_graph.get_operations():
        passed = {index: source for index in range(len(op.outputs))
                  if (source := tracer.passed_input(op, index)) is not None}
        if passed:
            result[op.name] = passed
    return result


def transposes_in_place(tf_graph: tf.Graph) -> frozenset[str]:
    """Names of `tf_graph`'s own Transpose ops that move no data: an identity permutation, or one that keeps
    the dimensions longer than 1 in order, the input's shape known."""
    in_place = set()
    for op in tf_graph.get_operations():
        if op.type != "Transpose":
            continue
        permutation = folded_value(op.inputs[1])
        if permutation is None:
            continue
        permutation = permutation.tolist()
        if permutation == sorted(permutation):  # the identity: whatever the shape
            in_place.add(op.name)
        elif op.inputs[0].shape.is_fully_defined():
            shape = op.inputs[0].shape.as_list()
            moved = [dimension for dimension in permutation if shape[dimension] != 1]
            if moved == sorted(moved):
                in_place.add(op.name)
    return frozenset(in_place)


class _Tracer:
    def __init__(self, bodies: FunctionBodies) -> None:
        self._bodies = bodies
        self._returned: dict[tuple[str, int], Optional[int]] = {}

    def passed_input(self, op: tf.Operation, index: int) -> Optional[int]:
        """The input of `op` that its output `index` returns unchanged, or None."""
        if op.type in FUNCTION_CALL_OPS:
            return self._returned_argument(op.get_attr("f").name, index)
        if op.type in FUNCTIONAL_LOOP_OPS:
            return index if self._returned_argument(op.get_attr("body").name, index) == index else None
        return None

    def _returned_argument(self, function: str, index: int) -> Optional[int]:
        """The argument of `function` that its return value `index` is, unchanged, or None."""
        key = (function, index)
        if key not in self._returned:
            self._returned[key] = None  # a function that (indirectly) returns through itself passes nothing
            body = self._bodies.get(function)
            if body is not None and index < len(body.outputs):
                self._returned[key] = self._argument(body, body.outputs[index])
        return self._returned[key]

    def _argument(self, body: tf.Graph, tensor: tf.Tensor) -> Optional[int]:
        arguments = {t.op: i for i, t in enumerate(body.inputs)}
        while tensor.op not in arguments:
            op = tensor.op
            if op.type in PASSTHROUGH_IDENTITY_OPS:
                tensor = op.inputs[0]
            elif op.type == "IdentityN":
                tensor = op.inputs[tensor.value_index]
            else:
                source = self.passed_input(op, tensor.value_index)
                if source is None:
                    return None
                tensor = op.inputs[source]
        return arguments[tensor.op]
