"""seqmem.edge.stack_lengths and the TensorArray sizes capture reads from a loop."""

import tensorflow as tf

from seqmem.edge.capture import from_tf


def _decoder_like(unstacked=False):
    """A loop of 7 steps writing [4, 10] rows to a TensorArray of dynamic size, stacked and transposed after
    ([4, 7, 10]; 7 unknown to TensorFlow); `unstacked`: made a list again, of which row 3 is returned."""

    @tf.function(autograph=False)
    def step(x):
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[None, 10])
        _, rows = tf.while_loop(lambda i, ta: i < 7, lambda i, ta: (i + 1, ta.write(i, x * tf.cast(i, tf.float32))),
                                (0, rows))
        product = tf.transpose(rows.stack(), [1, 0, 2]) * 2.0
        if unstacked:
            return tf.TensorArray(tf.float32, size=4, element_shape=[None, 10]).unstack(product).read(3)
        return product

    return step, [tf.TensorSpec([4, 10], tf.float32)]


def test_a_tensor_array_filled_in_a_loop_is_sized_by_its_trip_count_and_written_rows():
    graph = from_tf(*_decoder_like())
    (loop,) = [node for node in graph.nodes.values() if node.op in ("While", "StatelessWhile")]
    lists = [info for info in loop.outputs if info.dtype == "variant"]
    assert [(info.size_bytes, info.element_bytes) for info in lists] == [(7 * 4 * 10 * 4, 4 * 10 * 4)]


def test_shapes_downstream_of_the_stack_know_its_length():
    graph = from_tf(*_decoder_like())
    (product,) = [node for node in graph.nodes.values() if node.op == "Mul" and node.outputs[0].shape[0] == 4]
    assert product.outputs[0].shape == (4, 7, 10) and product.outputs[0].size_bytes == 4 * 7 * 10 * 4
    (stack,) = [node for node in graph.nodes.values() if node.op == "TensorListStack"]
    assert stack.attrs["num_elements"].i == -1  # the step that runs keeps its stack as traced


def test_a_list_made_from_a_tensor_downstream_of_the_stack_is_sized_from_its_refined_shape():
    graph = from_tf(*_decoder_like(unstacked=True))
    (made,) = [node for node in graph.nodes.values() if node.op == "TensorListFromTensor"]
    assert (made.outputs[0].size_bytes, made.outputs[0].element_bytes) == (4 * 7 * 10 * 4, 7 * 10 * 4)
