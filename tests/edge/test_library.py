import tensorflow as tf

from seqmem.edge.library import FunctionBodies, variable_writers
from seqmem.edge.unpacked_splits import unpack_splits
from tests.edge.rnn_step import rnn_step


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


def test_a_body_that_runs_an_edited_copy_is_built():
    # the Keras LSTM's functions hold its loop, whose body unpack_splits edits under a new name
    function, _variables, _inputs, _owners = rnn_step()
    library = unpack_splits(function.graph.as_graph_def()).library
    copies = {f.signature.name for f in library.function if f.signature.name.endswith("_seqmem_unpacked")}
    holders = [f.signature.name for f in library.function
               if any(n.attr["body"].func.name in copies for n in f.node_def if n.op in ("While", "StatelessWhile"))]
    assert holders
    bodies = FunctionBodies(library)
    for name in holders:
        assert any(op.type in ("While", "StatelessWhile") for op in bodies.get(name).get_operations())
