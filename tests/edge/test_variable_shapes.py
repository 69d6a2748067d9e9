"""seqmem.edge.variable_shapes: the variables a loop body reads, shaped so that what it computes from them is sized."""

import tensorflow as tf

from seqmem.edge import capture
from seqmem.edge.bodies import body_bytes
from seqmem.edge.variable_shapes import variable_shapes, with_variable_shapes

_MIB = 1 << 20


def _loop_reading(variable: tf.Variable, nested: bool = False):
    """A step whose loop (or a loop inside its loop) multiplies h, [256, 256], by `variable`, [256, 1024]:
    a 1 MiB product per iteration, cut back to h's shape."""

    def product(i, h):
        return i + 1, tf.matmul(h, variable)[:, :256]

    def body(i, h):
        if not nested:
            return product(i, h)
        return i + 1, tf.while_loop(lambda j, _: j < 2, product, (tf.constant(0), h))[1]

    @tf.function(autograph=False)
    def step(h):
        return tf.while_loop(lambda i, _: i < 3, body, (tf.constant(0), h))[1]

    return capture.from_tf(step.get_concrete_function(tf.TensorSpec([256, 256])))


def test_a_captured_variables_handle_carries_its_shape():
    variable = tf.Variable(tf.zeros([256, 1024]))
    shapes = variable_shapes(_loop_reading(variable))
    assert list(shapes.values()) == [(256, 1024)]


def test_a_loop_body_is_sized_with_the_shapes_of_the_variables_it_reads():
    graph = _loop_reading(tf.Variable(tf.zeros([256, 1024])))
    graph_def = capture.to_graph_def(graph)
    (unshaped,) = body_bytes(graph_def).values()
    (shaped,) = body_bytes(graph_def, variables=variable_shapes(graph)).values()
    # the product, unsized without the variable's shape, is the body's largest buffer with it
    assert unshaped < _MIB <= shaped < unshaped + _MIB + (256 << 10) + 1024


def test_the_shapes_follow_a_variable_into_a_nested_loop():
    graph = _loop_reading(tf.Variable(tf.zeros([256, 1024])), nested=True)
    graph_def = capture.to_graph_def(graph)
    assert max(body_bytes(graph_def).values()) < _MIB
    assert max(body_bytes(graph_def, variables=variable_shapes(graph)).values()) >= _MIB


def test_nothing_to_state_leaves_the_graph_def_as_it_is():
    graph_def = capture.to_graph_def(_loop_reading(tf.Variable(tf.zeros([256, 1024]))))
    assert with_variable_shapes(graph_def, {}) is graph_def


def test_a_conditionals_branches_are_sized_with_the_shapes_of_the_variables_they_read():
    variable = tf.Variable(tf.zeros([256, 1024]))

    @tf.function(autograph=False)
    def step(apply):  # a 1 MiB product of the variable, in the branch taken when `apply`
        return tf.cond(apply, lambda: tf.reduce_sum(variable * 2.0), lambda: tf.constant(0.0))

    graph = capture.from_tf(step.get_concrete_function(tf.TensorSpec([], tf.bool)))
    graph_def = capture.to_graph_def(graph)
    assert max(body_bytes(graph_def).values()) < _MIB  # the predicate is not one of the branch's arguments
    assert max(body_bytes(graph_def, variables=variable_shapes(graph)).values()) >= _MIB
