"""Device bytes of the constants TensorFlow folds a step, its called functions and its loop bodies into, and keeps.

TensorFlow inlines a step's function calls (Keras runs an LSTM's forward and
backward passes in called functions) and optimizes the result before it runs
it: Grappler replaces ZerosLike and OnesLike of a fully known shape, and Fill
of constant dimensions and a constant value, with constants whatever their
size (not a Fill of a `VariableShape`, as a gradient loop zeroes a variable's
gradient: measured, it is computed every step), and constant folding
(`common_runtime/constant_folding.cc`) evaluates every stateless node whose
inputs are all constant (Shape, ShapeN, Size and Rank of known shapes
included; no result over 10 MiB), keeping each result a non-constant node
reads as a Const. A Const's kernel holds its tensor in device memory as long
as the function lives: from the first call on, across steps (a Keras LSTM's
backward functions hold their folded gradients of unused outputs and zeroed
accumulators so).

The step's own graph is optimized the same way: its folded nodes (`folded_ops`)
hold their outputs across steps, as a Const does (a step reading
fill([2048, 1024], 3.0) holds the filled tensor from its first call on; so
does a gradient loop's zeroed initial values). Grappler's arithmetic
simplification replaces x + 0, x * 1 and x / 1 by x, so zeros only added and
ones only multiplied are not kept (zeros_like(x) + x holds nothing), and the op
itself allocates nothing: its output is x's buffer (`neutral_arithmetic`;
`tf.nn.silu` multiplies its input by a constant `beta` of 1 in its forward and
its gradient).

Each call node and each while loop of the step is charged what its functions
(a call's body; a loop's condition and body), and the functions they call or
loop over, hold so (`held_constants`): the constant tensors a non-constant
node or the function's caller reads. A call's argument is constant where the
caller passes a constant; a loop's are not (they change every iteration). A
constant nothing reads is pruned, whatever its size (an LSTM gradient loop's
body holds unread zeros). A loop body's constants are held across steps as a
call's are.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from seqmem.edge.library import FunctionBodies
from seqmem.edge.sizes import static_bytes
from seqmem.ir.op_tables import (CONST_OPS, DIVISION_OPS, FOLDED_SHAPE_OPS, FUNCTION_CALL_OPS, FUNCTIONAL_LOOP_OPS,
                                 MATERIALIZED_CONSTANT_OPS, NEUTRAL_ARITHMETIC_OPS, NEVER_FOLDED_OPS)

__all__ = ["MAX_FOLDED_BYTES", "constant_ops", "folded_ops", "folded_value", "held_constants", "neutral_arithmetic"]

MAX_FOLDED_BYTES = 10 << 20  # constant folding's limit per result (ConstantFoldingOptions)
_NEUTRAL_READER_OPS = frozenset().union(*NEUTRAL_ARITHMETIC_OPS.values())


def constant_ops(tf_graph: tf.Graph) -> dict[tf.Operation, bool]:
    """Whether each of `tf_graph`'s own ops is constant once TensorFlow has folded the graph: what
    `held_constants` and `folded_ops` take."""
    return _constant_ops(tf_graph.get_operations(), {})


def held_constants(tf_graph: tf.Graph, bodies: FunctionBodies,
                   constant: dict[tf.Operation, bool]) -> dict[str, tuple[int, ...]]:
    """For each function call and while loop in `tf_graph`'s own ops, by op name: the bytes of each constant
    its functions hold once instantiated (see the module docstring); functions not in `bodies` are left
    out. constant: `constant_ops(tf_graph)`."""
    result = {}
    for op in tf_graph.get_operations():
        held = _functions_held(bodies, op, constant)
        if held is not None:
            result[op.name] = held
    return result


def folded_ops(tf_graph: tf.Graph, constant: dict[tf.Operation, bool]) -> frozenset[str]:
    """Names of `tf_graph`'s own ops other than Const that TensorFlow replaces with constants it keeps (an
    output read by a non-constant op, or returned): their outputs stay on the device across steps.
    constant: `constant_ops(tf_graph)`."""
    returned = {t.ref() for t in getattr(tf_graph, "outputs", ())}  # a TF1 graph returns nothing
    return frozenset(op.name for op in tf_graph.get_operations()
                     if constant[op] and op.type not in CONST_OPS and _held_outputs(op, constant, returned))


def neutral_arithmetic(tf_graph: tf.Graph) -> dict[str, int]:
    """For each of `tf_graph`'s own ops that Grappler replaces with one of its operands (x + 0, x * 1, x / 1,
    x of the result's shape), by op name: the index of that operand, whose buffer the output is."""
    passed = {}
    for op in tf_graph.get_operations():
        if op.type in _NEUTRAL_READER_OPS and len(op.inputs) == 2:
            for index, tensor in enumerate(op.inputs):
                if _is_identity_with(op, tensor):
                    passed[op.name] = 1 - index
                    break
    return passed


def folded_value(tensor: tf.Tensor) -> np.ndarray | None:
    """The value constant folding gives `tensor`: what `tf.get_static_value` finds, else, where `tensor` is
    computed by stateless ops from constants alone (a gradient's permutation built from ranges and sums of
    known shapes), its value computed from them; None where it depends on anything else."""
    value = tf.get_static_value(tensor)
    if value is not None:
        return np.asarray(value)
    ancestors, pending = {}, [tensor.op]
    while pending:
        op = pending.pop()
        if op.name in ancestors:
            continue
        if op.type == "Placeholder" or op.op_def.is_stateful or op.type in NEVER_FOLDED_OPS:
            return None
        ancestors[op.name] = op
        pending.extend(t.op for t in op.inputs)
        pending.extend(op.control_inputs)
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.extend(op.node_def for op in ancestors.values())
    for node in graph_def.node:
        node.device = ""  # computed here, whatever device (a distributed worker's) the step places it on
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return np.asarray(session.run(tensor.name))


def _functions_held(bodies: FunctionBodies, op: tf.Operation, constant: dict) -> tuple[int, ...] | None:
    """Bytes of each constant `op`'s functions hold: a call's body, a loop's condition and body; None for
    other ops and functions not in `bodies`."""
    if op.type in FUNCTION_CALL_OPS:
        name = op.get_attr("f").name
        return _held(bodies, name, _constant_arguments(op, constant)) if name in bodies else None
    if op.type in FUNCTIONAL_LOOP_OPS:
        names = [op.get_attr(key).name for key in ("cond", "body")]
        if not all(name in bodies for name in names):
            return None
        return tuple(size for name in names for size in _held(bodies, name, frozenset()))
    return None


def _held(bodies: FunctionBodies, name: str, constant_arguments: frozenset[int]) -> tuple[int, ...]:
    body = bodies.get(name)
    arguments = {t.op: i for i, t in enumerate(body.inputs)}
    operations = body.get_operations()
    constant = _constant_ops(operations, {op: i in constant_arguments for op, i in arguments.items()})
    returned = {t.ref() for t in body.outputs}
    held: list[int] = []
    for op in operations:
        held.extend(_functions_held(bodies, op, constant) or ())
        if constant[op] and op not in arguments:
            sizes = (static_bytes(t.dtype, t.shape) for t in _held_outputs(op, constant, returned))
            held.extend(size for size in sizes if size)
    return tuple(held)


def _held_outputs(op: tf.Operation, constant: dict, returned: set) -> list[tf.Tensor]:
    """The outputs of constant `op` that TensorFlow keeps as constants: those returned or read by a
    non-constant op (constants read only by constants are folded away), unless every such reader only adds
    zeros or multiplies by ones, which Grappler's arithmetic simplification removes."""
    held = []
    for t in op.outputs:
        readers = [reader for reader in t.consumers() if not constant[reader]]
        if t.ref() in returned or (readers and not all(_is_identity_with(reader, t) for reader in readers)):
            held.append(t)
    return held


def _is_identity_with(reader: tf.Operation, tensor: tf.Tensor) -> bool:
    """Whether `reader` passes its other operand through unchanged given `tensor`: x + 0 or x * 1, x of the
    result's shape (Grappler then replaces the op with x)."""
    neutral_readers = NEUTRAL_ARITHMETIC_OPS.get(_uniform_value(tensor.op))
    if reader.type not in (neutral_readers or ()) or len(reader.inputs) != 2:
        return False
    if reader.type in DIVISION_OPS and reader.inputs[1].ref() != tensor.ref():
        return False
    others = [t for t in reader.inputs if t.ref() != tensor.ref()]
    return len(others) == 1 and others[0].shape.is_fully_defined() and others[0].shape == reader.outputs[0].shape


def _uniform_value(op: tf.Operation) -> float | None:
    """The value every element of `op`'s output has, where `op` makes a constant of one value; else None."""
    if op.type in CONST_OPS and (op.outputs[0].dtype.is_floating or op.outputs[0].dtype.is_integer):
        value = np.asarray(tf.get_static_value(op.outputs[0]))
        return float(value.flat[0]) if value.size and (value == value.flat[0]).all() else None
    if op.type == "ZerosLike":
        return 0.0
    if op.type == "OnesLike":
        return 1.0
    if op.type == "Fill" and op.outputs[0].dtype.is_floating:
        value = tf.get_static_value(op.inputs[1])
        return None if value is None else float(value)
    return None


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
    if op.type in CONST_OPS:
        return op.outputs[0].dtype != tf.resource
    if op.type in MATERIALIZED_CONSTANT_OPS:  # numbers only: a TensorList's zeros are a list made at run time
        return static_bytes(op.outputs[0].dtype, op.outputs[0].shape) is not None
    if op.type in FOLDED_SHAPE_OPS:
        return all(t.shape.is_fully_defined() for t in op.inputs)
    if op.type == "Rank":
        return op.inputs[0].shape.rank is not None
    if op.op_def.is_stateful or op.type in NEVER_FOLDED_OPS or not op.inputs:
        return False
    if (op.type == "Fill" and op.outputs[0].shape.is_fully_defined()
            and all(constant.get(t.op, False) for t in op.inputs)):
        return True  # materialized whatever its size, once its dimensions and value are constants
    if any((static_bytes(t.dtype, t.shape) or 0) > MAX_FOLDED_BYTES for t in op.outputs):
        return False
    return all(constant.get(t.op, False) for t in op.inputs)


