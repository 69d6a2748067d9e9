import tensorflow as tf

from seqmem.edge import capture
from seqmem.ir.merged import merged_duplicates


def _captured(function, *specs):
    return capture.from_tf(tf.function(function), specs)


def test_a_computation_held_twice_is_marked_with_the_first_and_merged_as_tensorflow_runs_it():
    def step(x):  # two layers' ReLU of the same input, each padded the same way, as in Keras' NASNet
        first = tf.pad(tf.nn.relu(x, name="relu_a"), [[1, 1], [1, 1]], name="pad_a")
        second = tf.pad(tf.nn.relu(x, name="relu_b"), [[1, 1], [1, 1]], name="pad_b")
        return tf.reduce_sum(first * 2.0) + tf.reduce_sum(second * 3.0)

    graph = _captured(step, tf.TensorSpec([8, 8]))
    assert graph.node("relu_b").duplicate_of == "relu_a"
    assert graph.node("pad_b").duplicate_of == "pad_a"  # once its input and its padding constant merged
    assert graph.node("relu_a").duplicate_of == "" and graph.node("pad_b").inputs[0].node == "relu_b"  # kept
    merged = merged_duplicates(graph)
    assert {"relu_b", "pad_b"}.isdisjoint(merged.nodes) and "pad_a" in merged.nodes
    readers = [n for n in merged.nodes.values() if n.op == "Mul"]
    assert len(readers) == 2 and all(n.inputs[0].node == "pad_a" for n in readers)
    merged.validate()


def test_random_ops_inputs_lists_and_returned_values_are_never_marked():
    def step(x, y):
        noise = tf.random.uniform([4]) + tf.random.uniform([4])  # stateful: two draws
        lists = [tf.raw_ops.EmptyTensorList(element_shape=[4], max_num_elements=2, element_dtype=tf.float32)
                 for _ in range(2)]
        pushed = [tf.raw_ops.TensorListPushBack(input_handle=handle, tensor=x) for handle in lists]
        stacked = [tf.raw_ops.TensorListStack(input_handle=handle, element_shape=[4], element_dtype=tf.float32)
                   for handle in pushed]
        return tf.identity(x + 1.0, name="out_a"), tf.identity(x + 1.0, name="out_b"), y * 2.0, noise, stacked

    graph = _captured(step, tf.TensorSpec([4]), tf.TensorSpec([4]))
    marked = {node.op for node in graph.nodes.values() if node.duplicate_of}
    assert {"RandomUniform", "Placeholder", "EmptyTensorList", "TensorListPushBack"}.isdisjoint(marked)
    assert graph.node("out_b").duplicate_of == "out_a"  # the tensors returned are the function's Identities
    returned = {ref.node for ref in graph.outputs}
    assert all(not graph.node(name).duplicate_of for name in returned)
    assert returned <= set(merged_duplicates(graph).nodes)


def test_what_an_in_place_op_writes_into_is_never_marked_nor_what_passes_it_on():
    def step(x):
        written = tf.raw_ops.InplaceAdd(x=tf.identity(tf.nn.relu(x, name="relu_a"), name="passed_a"), i=[0],
                                        v=tf.ones([1, 4]))
        read = tf.nn.relu(x, name="relu_b")  # equal to relu_a, which the in-place op writes into
        again = tf.nn.relu(x, name="relu_c")  # equal to relu_b, written into by nothing
        return tf.reduce_sum(written) + tf.reduce_sum(read * 2.0) + tf.reduce_sum(again * 3.0)

    graph = _captured(step, tf.TensorSpec([2, 4]))
    assert graph.node("relu_a").duplicate_of == "" and graph.node("passed_a").duplicate_of == ""
    assert graph.node("relu_b").duplicate_of == ""  # relu_a stands for nothing: it is not a candidate
    assert graph.node("relu_c").duplicate_of == "relu_b"
