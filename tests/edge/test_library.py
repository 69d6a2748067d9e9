import tensorflow as tf

from seqmem.edge.library import variable_writers


def test_a_call_of_a_function_that_updates_a_variable_is_a_writer():
    weight = tf.Variable(tf.ones([8, 8]))
    steps = tf.Variable(0)

    @tf.function
    def update(gradient):  # a nested tf.function: one call node in the step's graph
        weight.assign_sub(0.1 * gradient)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.matmul(x, weight)))
        update(tape.gradient(loss, weight))
        steps.assign_add(1)
        return loss

    function = step.get_concrete_function(tf.TensorSpec([4, 8]))
    graph_def = function.graph.as_graph_def()
    writers = variable_writers(graph_def)
    calls = {n.name for n in graph_def.node if n.op == "StatefulPartitionedCall"}
    assert calls and calls <= writers
    assert {n.name for n in graph_def.node if n.op == "AssignAddVariableOp"} <= writers
    assert not writers & {n.name for n in graph_def.node if n.op in ("MatMul", "Tanh", "ReadVariableOp")}

