import numpy as np
import pytest
import tensorflow as tf

from seqmem.analyze.anatomy import analyze_step
from seqmem.edge import capture
from seqmem.ir.graph import TensorRef, view_source
from tests.keras_steps import classifier_step


def _mlp_step():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input([6]), tf.keras.layers.Dense(5, activation="relu"), tf.keras.layers.Dense(3)])
    step = classifier_step(model, tf.keras.optimizers.SGD(0.1, momentum=0.9))
    return step, (tf.TensorSpec([4, 6], tf.float32), tf.TensorSpec([4], tf.int32))


def test_graph_def_round_trip_is_lossless():
    step, specs = _mlp_step()
    graph_def = step.get_concrete_function(*specs).graph.as_graph_def()
    assert capture.to_graph_def(capture.from_tf(graph_def)) == graph_def


def test_tf2_tape_step_anatomy_and_variable_sizes():
    step, specs = _mlp_step()
    graph = capture.from_tf(step, specs)
    anatomy = analyze_step(graph)
    assert graph.node(anatomy.losses[0].node).op == "Mean"
    relu = next(r for r in anatomy.feature_maps if graph.node(r.node).op == "Relu")
    assert graph.tensor(relu).size_bytes == 4 * 5 * 4
    # weights 6x5+5 and 5x3+3, each with a momentum slot: booked on the handle placeholders
    assert sum(n.resource_bytes for n in graph.nodes.values()) >= 2 * 4 * (6 * 5 + 5 + 5 * 3 + 3)
    assert len(graph.outputs) == 1


def test_tf1_gradients_graph_anatomy():
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 2], use_resource=False)
        hidden = tf.nn.tanh(tf.matmul(x, w), name="hidden")
        loss = tf.reduce_sum(hidden, name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    graph = capture.from_tf(tf_graph)
    anatomy = analyze_step(graph)
    assert anatomy.losses == (TensorRef("loss"),)
    assert TensorRef("hidden") in anatomy.feature_maps


def test_keras_train_function_anatomy():
    model = tf.keras.Sequential([tf.keras.Input([6]), tf.keras.layers.Dense(4), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    train_function = model.make_train_function()
    dataset = tf.data.Dataset.from_tensors((tf.zeros([3, 6]), tf.zeros([3], tf.int32)))
    graph = capture.from_tf(train_function, [iter(dataset)])
    anatomy = analyze_step(graph)
    assert anatomy.backward and anatomy.feature_maps


def test_lstm_accumulators_are_sized_through_loops_and_calls():
    tf.keras.utils.set_random_seed(0)
    layer = tf.keras.layers.LSTM(8, return_sequences=True)
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
        return loss

    graph = capture.from_tf(step, [tf.TensorSpec([2, 7, 3], tf.float32)])
    lists = [graph.tensor(r) for r in analyze_step(graph).feature_maps if graph.tensor(r).dtype == "variant"]
    sizes = [info.size_bytes for info in lists]
    # per-step [batch, units] float32 lists over 7 steps, each element a buffer of its own
    assert 7 * 2 * 8 * 4 in sizes
    assert None not in sizes
    assert all(info.element_bytes == 2 * 8 * 4 for info in lists if info.size_bytes == 7 * 2 * 8 * 4)


def _loop_step():
    """A differentiated tf.while_loop whose body reads a weight (ReadVariableOp), beside an embedding that is
    gathered (ResourceGather) and read whole; its graph."""
    weight = tf.Variable(tf.ones([64, 64]))
    embedding = tf.Variable(tf.ones([10, 64]))

    @tf.function(autograph=False)
    def step(h):
        with tf.GradientTape() as tape:
            start = h @ weight + tf.reduce_sum(tf.gather(embedding, [1, 2])) + tf.reduce_sum(embedding)
            final = tf.while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, tf.tanh(x @ weight)),
                                  (tf.constant(0), start))[1]
            loss = tf.reduce_sum(final)
        return tape.gradient(loss, [weight, embedding])

    return capture.from_tf(step, [tf.TensorSpec([8, 64], tf.float32)])


def test_loop_lists_of_a_variables_value_or_of_another_lists_buffers_hold_none_of_their_own():
    graph = _loop_step()
    loop = next(node for node in graph.nodes.values() if node.op in ("While", "StatelessWhile"))
    lists = [info for info in loop.outputs if info.dtype == "variant"]
    # what the gradient needs of every iteration: the tanh ([8, 64] float32, 5 iterations, a buffer each);
    # x, which is the tanh the iteration before returned (the same buffers, counted once); and the weight's
    # value, which every element shares with the variable
    assert sorted(info.size_bytes for info in lists) == [0, 0, 5 * 8 * 64 * 4]


def test_reads_of_a_variable_a_sparse_op_touches_are_copies():
    graph = _loop_step()
    reads = {name: node.outputs[0].copies_input for name, node in graph.nodes.items() if node.op == "ReadVariableOp"}
    gathered = {node.inputs[0] for node in graph.nodes.values() if node.op == "ResourceGather"}
    assert gathered and any(reads.values()) and not all(reads.values())
    for name, copies in reads.items():
        assert copies == (graph.node(name).inputs[0] in gathered), name


def test_unsupported_target_is_a_type_error():
    with pytest.raises(TypeError, match="tf.function, a ConcreteFunction, a tf.Graph or a GraphDef"):
        capture.from_tf(np.zeros(3))


def test_a_function_is_captured_without_what_tensorflow_prunes():
    # silu's custom gradient also differentiates its constant beta: TensorFlow never runs that part
    variable = tf.Variable(tf.zeros([4, 4]))

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.silu(x))
        unused = tf.exp(x) * 3.0  # neither returned nor read by a stateful op
        variable.assign(tf.sqrt(x))  # nothing reads it, but it is stateful: kept with what it reads
        return loss, tape.gradient(loss, x)

    spec = tf.TensorSpec([4, 4])
    function = step.get_concrete_function(spec)
    kept = set(capture.from_tf(step, [spec]).nodes)
    everything = {op.name for op in function.graph.get_operations()}
    assert {"Exp", "mul_2", "Sqrt", "AssignVariableOp"} <= everything
    assert {"Sqrt", "AssignVariableOp"} <= kept and not {"Exp", "mul_2"} & kept
    squares = {op.name for op in function.graph.get_operations() if op.type == "Square"}  # beta's gradient
    assert squares and not squares & kept


@pytest.mark.parametrize("shape, permutation, in_place", [
    ([6, 5], [0, 1], True), ([6, 1, 5], [1, 0, 2], True), ([6, 1, 5], [0, 2, 1], True), ([6, 5], [1, 0], False),
    ([None, 5], [0, 1], True), ([None, 1, 5], [1, 0, 2], False)])  # an unknown length may be more than 1
def test_a_transpose_that_moves_no_data_shares_its_inputs_buffer(shape, permutation, in_place):
    # the permutation computed from known shapes, as a gather's gradient builds it: constant folding knows it
    @tf.function(autograph=False)
    def step(x):
        rank = tf.rank(x)
        computed = tf.concat([tf.range(rank - rank), tf.constant(permutation) + tf.zeros([], tf.int32)], 0)
        return tf.transpose(tf.exp(x), computed)

    graph = capture.from_tf(step, [tf.TensorSpec(shape)])
    (transpose,) = [node for node in graph.nodes.values() if node.op == "Transpose"]
    assert (view_source(transpose, 0) == TensorRef("Exp", 0)) == in_place
