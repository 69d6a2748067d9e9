"""seqmem.edge.loop_swap: which of a loop's saved activations can go to host memory, and the rewrite that sends them."""

import dataclasses

import pytest

from seqmem.edge.loop_swap import loop_accumulators, swap_loop_accumulators
from seqmem.edge.loops import bound_loops


def _nmt_step(batch, time_steps, units):
    """(concrete function, the tf.function: it owns the variables the function holds weakly)."""
    from models.nmt.benchmark import training_step

    step, _, specs = training_step(batch, time_steps, units, vocab=100)
    return step.get_concrete_function(*specs), step


@pytest.fixture(scope="module")
def small_nmt_step():
    return _nmt_step(4, 6, 16)


def test_decoder_accumulators_are_found_and_serialized(small_nmt_step):
    # that the swapped step trains bit-identically: tests/runtime/test_optimize_loops.py, through optimize
    graph_def = small_nmt_step[0].graph.as_graph_def()
    swaps = loop_accumulators(graph_def)
    names = [swap.accumulator for swap in swaps]
    assert any("BahdanauAttention/Tanh_0" in name for name in names)  # the [B, T, H] tanh kept every step
    assert not any("ReadVariableOp" in name or "Less_0" in name for name in names)  # variable reads, bools
    assert all(swap.dtype == "float32" and swap.element_bytes for swap in swaps)
    swapped = bound_loops(swap_loop_accumulators(graph_def, swaps), 1)
    ops = [n.op for f in swapped.library.function for n in f.node_def]
    assert ops.count("SerializeTensor") == len(swaps) and ops.count("ParseTensor") == len(swaps)


def test_accumulators_saving_one_buffer_name_the_same_buffer(small_nmt_step):
    swaps = loop_accumulators(small_nmt_step[0].graph.as_graph_def())
    decoder = {swap.accumulator.split("/while/")[-1]: swap.buffer for swap in swaps if "decoder" in swap.forward_loop}
    # the attention weights and their expanded view; the cell's h and the loop variable that carries it
    assert decoder["attention_wrapper/BahdanauAttention/Softmax_0/accumulator"].endswith("Softmax:softmax:0")
    assert decoder["attention_wrapper/ExpandDims_0/accumulator"] == decoder[
        "attention_wrapper/BahdanauAttention/Softmax_0/accumulator"]
    assert decoder["Placeholder_3_0/accumulator"] == decoder["attention_wrapper/lstm_cell/mul_2_0/accumulator"]
    assert len(set(decoder.values())) == len(decoder) - 2  # every other list saves a buffer of its own


def test_no_swaps_and_foreign_swaps(small_nmt_step):
    graph_def = small_nmt_step[0].graph.as_graph_def()
    unchanged = swap_loop_accumulators(graph_def, [])
    assert unchanged.SerializeToString(deterministic=True) == graph_def.SerializeToString(deterministic=True)
    foreign = dataclasses.replace(loop_accumulators(graph_def)[0], forward_index=0)
    with pytest.raises(ValueError, match="not swappable loop accumulators of this graph"):
        swap_loop_accumulators(graph_def, [foreign])


def test_loops_inside_keras_functions_are_found_and_their_copies_stand_for_no_api():
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Embedding(50, 8), tf.keras.layers.LSTM(16, return_sequences=True,
                                 name="lstm"), tf.keras.layers.Dense(50)], name="lm")
    model.build((4, 6))

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(x, model(x), from_logits=True))
        return tape.gradient(loss, model.trainable_variables)

    graph_def = step.get_concrete_function(tf.TensorSpec([4, 6], tf.int32)).graph.as_graph_def()
    swaps = loop_accumulators(graph_def)
    calls = {n.name: n.op for n in graph_def.node}
    # 6 gate and state lists of [4, 16] and the input's of [4, 8]; the iteration counter (int) is not a candidate
    assert len(swaps) == 8 and {swap.forward_loop for swap in swaps} == {"lm/lstm/PartitionedCall"}
    assert all(swap.accumulator.startswith("lm/lstm/PartitionedCall/while/") for swap in swaps)
    assert all(calls[swap.gradient_loop] == "PartitionedCall" and swap.element_bytes for swap in swaps)
    swapped = swap_loop_accumulators(graph_def, swaps)
    copies = [f for f in swapped.library.function if "_seqmem_swapped_" in f.signature.name]
    assert len(copies) == 4  # forward function and body, backward function and gradient body
    # another set of the loop's lists is another set of copies: a process cannot hold two functions of one name
    fewer = swap_loop_accumulators(graph_def, swaps[:2])
    assert not {f.signature.name for f in copies} & {f.signature.name for f in fewer.library.function}
    assert not any("api_implements" in f.attr for f in copies)  # Grappler cannot trade them for the originals
    ops = [n.op for f in swapped.library.function for n in f.node_def]
    assert ops.count("SerializeTensor") == len(swaps) == ops.count("ParseTensor")


def test_a_loop_in_a_function_called_from_two_places_is_not_a_candidate():
    # a rewrite of the shared function would change both calls: its lists are left alone
    import tensorflow as tf

    weight = tf.Variable(tf.fill([8, 8], 0.1))

    def loop(h, x):
        return tf.while_loop(lambda i, h: i < 5, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, weight) + x)), (0, h))[1]

    shared = tf.function(loop, autograph=False)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = sum(tf.reduce_sum(h) for h in (shared(x, x), shared(2 * x, x), loop(3 * x, x)))
        return tape.gradient(loss, weight)

    graph_def = step.get_concrete_function(tf.TensorSpec([4, 8])).graph.as_graph_def()
    calls = [n for n in graph_def.node if n.op in ("PartitionedCall", "StatefulPartitionedCall")]
    forward_calls = [n for n in calls if n.attr["f"].func.name.startswith("__forward")]
    assert len(forward_calls) == 2 and len({n.attr["f"].func.name for n in forward_calls}) == 1
    swaps = loop_accumulators(graph_def)
    assert swaps and {swap.forward_loop for swap in swaps} == {"while"}  # the step's own loop only
