"""Device bytes of the constants a step's called functions hold once TensorFlow has instantiated them.

TensorFlow inlines a step's function calls (Keras runs an LSTM's forward and
backward passes in called functions) and optimizes the result before it runs
it: Grappler replaces ZerosLike and OnesLike of a fully known shape, and Fill
of a constant, with constants whatever their size, and constant folding
(`common_runtime/constant_folding.cc`) evaluates every stateless node whose
inputs are all constant (Shape, ShapeN, Size and Rank of known shapes
included; no result over 10 MiB), keeping each result a non-constant node
reads as a Const. A Const's kernel holds its tensor in device memory as long
as the function lives: from the first call on, across steps. Measured on a
Keras LSTM language model (emulated device): the backward functions' folded
gradients of unused outputs and zeroed accumulators, 3.3 MB, held through
every step; the simulator saw none of it inside the calls.

Here each call node of the step is charged what its function's body (and the
functions it calls) holds so: the constant tensors a non-constant node or the
function's caller reads. A call's argument is constant where the caller passes
a constant. Loop bodies are left out (`seqmem.edge.bodies` charges their
constants to the loop); so are the step's own nodes, which the simulator sees.
"""

from __future__ import annotations

import tensorflow as tf

from seqmem.edge.library import FunctionBodies
from seqmem.edge.sizes import static_bytes
from seqmem.ir.op_tables import FUNCTION_CALL_OPS, FUNCTIONAL_LOOP_OPS, TF1_CONTROL_FLOW_OPS

__all__ = ["MAX_FOLDED_BYTES", "call_constant_bytes"]

MAX_FOLDED_BYTES = 10 << 20  # constant folding's limit per result (ConstantFoldingOptions)

_MATERIALIZED_OPS = frozenset({"OnesLike", "ZerosLike"})  # constants of any size once their shape is known
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size"})
_NEVER_FOLDED_OPS = FUNCTION_CALL_OPS | FUNCTIONAL_LOOP_OPS | TF1_CONTROL_FLOW_OPS | frozenset(
    {"If", "Placeholder", "StatelessIf"})


def call_constant_bytes(tf_graph: tf.Graph, bodies: FunctionBodies) -> dict[str, int]:
    """For each function call in `tf_graph`'s own ops, by op name: bytes of the constants its function holds
    once instantiated (see the module docstring); calls of functions not in `bodies` are left out."""
    constant = _constant_ops(tf_graph.get_operations(), {})
    result = {}
    for op in tf_graph.get_operations():
        if op.type in FUNCTION_CALL_OPS and op.get_attr("f").name in bodies:
            result[op.name] = _held_bytes(bodies, op.get_attr("f").name, _constant_arguments(op, constant))
    return result


def _held_bytes(bodies: FunctionBodies, name: str, constant_arguments: frozenset[int]) -> int:
    body = bodies.get(name)
    arguments = {t.op: i for i, t in enumerate(body.inputs)}
    operations = body.get_operations()
    constant = _constant_ops(operations, {op: i in constant_arguments for op, i in arguments.items()})
    returned = {t.ref() for t in body.outputs}
    held = 0
    for op in operations:
        if op.type in FUNCTION_CALL_OPS and op.get_attr("f").name in bodies:
            held += _held_bytes(bodies, op.get_attr("f").name, _constant_arguments(op, constant))
        if constant[op] and op not in arguments:
            held += sum(static_bytes(t.dtype, t.shape) or 0 for t in op.outputs
                        if t.ref() in returned or not all(constant[reader] for reader in t.consumers()))
    return held


def _constant_arguments(call: tf.Operation, constant: dict) -> frozenset[int]:
    return frozenset(i for i, t in enumerate(call.inputs) if constant[t.op])


def _constant_ops(operations, known: dict) -> dict:
    """Whether each of `operations` (in topological order) is constant after TensorFlow's folding, given
    `known` verdicts (a function's arguments)."""
    constant = dict(known)
    for op in operations:
        if op not in constant:
            constant[op] = _is_constant(op, constant)
    return constant


def _is_constant(op: tf.Operation, constant: dict) -> bool:
    if op.type in ("Const", "HostConst"):
        return op.outputs[0].dtype != tf.resource
    if op.type in _MATERIALIZED_OPS:  # numbers only: a TensorList's zeros are a list made at run time
        return static_bytes(op.outputs[0].dtype, op.outputs[0].shape) is not None
    if op.type in _SHAPE_OPS:
        return all(t.shape.is_fully_defined() for t in op.inputs)
    if op.type == "Rank":
        return op.inputs[0].shape.rank is not None
    if op.op_def.is_stateful or op.type in _NEVER_FOLDED_OPS or not op.inputs:
        return False
    if op.type == "Fill" and op.outputs[0].shape.is_fully_defined() and constant.get(op.inputs[1].op, False):
        return True
    if any((static_bytes(t.dtype, t.shape) or 0) > MAX_FOLDED_BYTES for t in op.outputs):
        return False
    return all(constant.get(t.op, False) for t in op.inputs)


