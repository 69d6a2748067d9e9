"""seqmem.edge.gates: a while loop starts once all its inputs exist, and computes the same."""

import numpy as np
import tensorflow as tf

from seqmem.edge.gates import gate_loops
from seqmem.edge.runner import graph_def_runner


def _step():
    """A differentiated tf.while_loop (a forward and a gradient loop) and its variable."""
    weight = tf.Variable(tf.random.stateless_normal([8, 8], seed=[1, 2]) * 0.3)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.while_loop(lambda i, h: i < 6, lambda i, h: (i + 1, tf.tanh(h @ weight)), (tf.constant(0), x))[1]
            loss = tf.reduce_sum(h ** 2)
        weight.assign_sub(0.1 * tape.gradient(loss, weight))
        return loss

    return step.get_concrete_function(tf.TensorSpec([4, 8])), weight


def test_each_loop_waits_for_every_node_that_makes_an_input_but_those_ready_from_the_start():
    function, _weight = _step()
    graph_def = function.graph.as_graph_def()
    gated = gate_loops(graph_def)
    nodes = {node.name: node for node in graph_def.node}
    loops = [node for node in gated.node if node.op in ("While", "StatelessWhile")]
    assert len(loops) == 2  # the forward loop and its gradient
    free = set()
    for loop in loops:
        producers = {name.split(":")[0] for name in loop.input if not name.startswith("^")}
        waits_for = {name[1:] for name in loop.input if name.startswith("^")}
        assert waits_for and waits_for == {name for name in producers if nodes[name].input}
        free |= producers - waits_for
    assert {nodes[name].op for name in free} >= {"Placeholder"}  # ready from the start: no edge
    others = {node.name: node for node in gated.node if node.op not in ("While", "StatelessWhile")}
    assert all(node == nodes[name] for name, node in others.items())
    assert len(graph_def.node) == len(gated.node) and graph_def != gated  # the input is left as it was


def test_a_gated_step_computes_the_same(op_determinism):
    function, weight = _step()
    start = weight.numpy()
    x = tf.random.stateless_normal([4, 8], seed=[3, 4])
    results = []
    for run in (function, graph_def_runner(function, gate_loops(function.graph.as_graph_def()))):
        weight.assign(start)
        results.append(([float(tf.nest.flatten(run(x))[0]) for _ in range(2)], weight.numpy()))
    assert results[0][0] == results[1][0] and np.array_equal(results[0][1], results[1][1])
