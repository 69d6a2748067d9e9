"""seqmem.edge.passthrough: outputs of calls and loops that are an input, returned unchanged."""

import tensorflow as tf

from seqmem.edge.capture import from_tf
from seqmem.edge.library import FunctionBodies
from seqmem.edge.passthrough import passed_through_inputs
from seqmem.ir.graph import TensorRef, view_source
from seqmem.sim.simulator import simulate

_SPEC = tf.TensorSpec([256, 256], tf.float32)  # 256 KiB


def _passed(outer):
    function = outer.get_concrete_function(_SPEC)
    return function.graph, passed_through_inputs(function.graph, FunctionBodies(function.graph.as_graph_def().library))


def test_a_call_returning_its_argument_and_a_loop_invariant_passes_them_through():
    @tf.function(autograph=False)
    def inner(x, w):
        # w is a loop invariant; x is changed each iteration
        _, y, v = tf.while_loop(lambda i, y, v: i < 3, lambda i, y, v: (i + 1, y @ v, v), (0, x, w))
        return y, tf.identity(v), tf.identity(x)

    @tf.function(autograph=False)
    def outer(x):
        return inner(x, x * 2.0)

    tf_graph, passed = _passed(outer)
    (call,) = [op for op in tf_graph.get_operations() if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
    assert passed[call.name] == {1: 1, 2: 0}  # y is new; v is w, the last output x


def test_a_loop_passes_its_invariants_through():
    @tf.function(autograph=False)
    def outer(x):
        return tf.while_loop(lambda i, y, v: i < 3, lambda i, y, v: (i + 1, y @ v, v), (0, x, x * 2.0))

    tf_graph, passed = _passed(outer)
    (loop,) = [op for op in tf_graph.get_operations() if op.type in ("While", "StatelessWhile")]
    # while_v2 puts its counter and its iteration bound (an invariant) before the loop's own (i, y, v)
    assert passed[loop.name] == {1: 1, 4: 4}


def test_the_simulator_counts_a_passed_through_output_as_its_inputs_buffer():
    @tf.function(autograph=False)
    def inner(x, w):
        return x @ w, tf.identity(w)

    @tf.function(autograph=False)
    def outer(x):
        product, w = inner(x, x * 2.0)
        return product + w

    graph = from_tf(outer, [_SPEC])
    (call,) = [node for node in graph.nodes.values() if node.op in ("PartitionedCall", "StatefulPartitionedCall")]
    assert view_source(call, 1) == call.inputs[1] and view_source(call, 0) is None
    trace = simulate(graph, graph.topological_order())
    assert trace.buffer_of[TensorRef(call.name, 1)] == trace.buffer_of[call.inputs[1]]
