"""seqmem.layers.recurrent: drop-in LSTM/GRU layers that recompute each step's gates in backward."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_addons as tfa

from seqmem.edge.loop_swap import loop_accumulators
from seqmem.layers.lstm_sequence import _blocks
from seqmem.runtime.optimize import optimize
from seqmem.layers.recurrent import MemoryEfficientGRU, MemoryEfficientGRUCell, MemoryEfficientLSTM, MemoryEfficientLSTMCell

PAIRS = [(tf.keras.layers.LSTM, MemoryEfficientLSTM), (tf.keras.layers.GRU, MemoryEfficientGRU)]


def _outputs_and_gradients(layer, inputs, mask=None):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        outputs = layer(inputs, mask=mask)
        loss = tf.reduce_sum(outputs[0] * tf.range(1.0, 1.0 + outputs[0].shape[-1])) + tf.reduce_sum(outputs[-1])
    return [o.numpy() for o in outputs], [g.numpy() for g in tape.gradient(loss, [inputs, *layer.trainable_variables])]


# no option: the LSTM runs seqmem.layers.lstm_sequence; a mask or go_backwards: the memory-efficient cell step by step
@pytest.mark.parametrize("options", [{}, {"mask": True}, {"go_backwards": True}])
@pytest.mark.parametrize("keras_class, efficient_class", PAIRS)
def test_same_weights_outputs_and_gradients_as_keras(keras_class, efficient_class, options):
    inputs = tf.random.stateless_normal([3, 7, 5], seed=[1, 2])
    mask = tf.sequence_mask([7, 5, 2], 7) if options.get("mask") else None
    results = []
    for cls in (keras_class, efficient_class):
        tf.keras.utils.set_random_seed(0)
        layer = cls(4, return_sequences=True, return_state=True, go_backwards=options.get("go_backwards", False),
                    name="rnn")
        results.append((layer, *_outputs_and_gradients(layer, inputs, mask)))
    (keras_layer, outputs, gradients), (layer, efficient_outputs, efficient_gradients) = results
    assert [v.name for v in layer.weights] == [v.name for v in keras_layer.weights]
    assert [v.shape for v in layer.weights] == [v.shape for v in keras_layer.weights]
    for a, b in zip(outputs + gradients, efficient_outputs + efficient_gradients):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)  # the same maths, fused or step by step


@pytest.mark.parametrize("options", [{"use_bias": False}, {"time_major": True}, {"return_sequences": False},
                                     {"activation": "relu", "recurrent_activation": "hard_sigmoid"}])
def test_the_lstm_sequence_matches_keras_with_the_layers_options(options):
    inputs = tf.random.stateless_normal([3, 7, 5], seed=[1, 2])
    results = []
    for cls in (tf.keras.layers.LSTM, MemoryEfficientLSTM):
        tf.keras.utils.set_random_seed(0)
        layer = cls(4, return_state=True, **({"return_sequences": True} | options))
        results.append(_outputs_and_gradients(layer, inputs))
    (outputs, gradients), (efficient_outputs, efficient_gradients) = results
    for a, b in zip(outputs + gradients, efficient_outputs + efficient_gradients):
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-6 * np.abs(a).max())  # float rounding, as below


@pytest.mark.parametrize("batch, steps", [(2, 40), (48, 40), (1100, 6), (5, 37)])
def test_the_lstm_sequence_matches_keras_in_blocks_and_with_unknown_shapes(batch, steps):
    """One block of 40 steps, two of 20, six of 1 and one of 37 (a prime number of steps); and the same
    traced with the time and batch dimensions unknown (blocks of 768, 32, 1 and 307 steps, the last shorter)."""
    inputs = tf.random.stateless_normal([batch, steps, 6], seed=[3, 5])
    results = []
    for cls in (tf.keras.layers.LSTM, MemoryEfficientLSTM):
        tf.keras.utils.set_random_seed(1)
        layer = cls(8, return_sequences=True, return_state=True)
        layer(inputs)

        def step(x, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch(x)
                outputs = layer(x)
                loss = tf.reduce_sum(outputs[0] * tf.range(1.0, 9.0)) + tf.reduce_sum(outputs[2])
            return outputs, tape.gradient(loss, [x, *layer.trainable_variables])

        unknown = tf.function(step, input_signature=[tf.TensorSpec([None, None, 6])])
        results.append([tf.nest.flatten(run(inputs)) for run in (tf.function(step), unknown)])
    for keras_values, efficient_values in zip(*results):
        for a, b in zip(keras_values, efficient_values):
            # the weights' gradients are summed over blocks of steps, not step by step: float32 rounding,
            # within 2e-6 of the tensor's largest value (5e-7 seen)
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=2e-6 * np.abs(a.numpy()).max())


@pytest.mark.parametrize("keras_class, efficient_class", PAIRS)
def test_checkpoints_load_either_way_and_config_round_trips(keras_class, efficient_class, tmp_path):
    inputs = tf.random.stateless_normal([2, 4, 3], seed=[3, 4])
    keras_layer, layer = keras_class(5), efficient_class(5)
    keras_layer(inputs), layer(inputs)
    path = tf.train.Checkpoint(layer=keras_layer).write(str(tmp_path / "keras"))
    tf.train.Checkpoint(layer=layer).read(path).assert_consumed()
    np.testing.assert_allclose(layer(inputs), keras_layer(inputs), rtol=1e-6, atol=1e-6)
    copy = efficient_class.from_config(layer.get_config())
    assert type(copy) is efficient_class and type(copy.cell).__name__.startswith("MemoryEfficient")


@pytest.mark.parametrize("efficient_class", [MemoryEfficientLSTM, MemoryEfficientGRU, MemoryEfficientLSTMCell])
def test_dropout_is_refused_with_a_clear_error(efficient_class):
    with pytest.raises(ValueError, match="does not support dropout.*Dropout to the layer's inputs"):
        efficient_class(4, dropout=0.1)
    with pytest.raises(ValueError, match="recurrent_dropout=0.2"):
        efficient_class(4, recurrent_dropout=0.2)


def _saved_bytes_per_step(layer_class, units=16, batch=4):
    """Bytes the layer's loop saves per time step for its gradient (float TensorList accumulators), and the
    `parallel_iterations` of the step's forward loops; the inputs masked, so that both LSTMs run a cell step
    by step in Keras' loop."""
    tf.keras.utils.set_random_seed(0)
    layer = layer_class(units)
    inputs, mask = tf.random.stateless_normal([batch, 6, 8], seed=[5, 6]), tf.sequence_mask([6, 5, 4, 6], 6)
    layer(inputs, mask=mask)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, mask=mask))
        return tape.gradient(loss, layer.trainable_variables)

    graph_def = step.get_concrete_function(inputs).graph.as_graph_def()
    loops = {node.attr["parallel_iterations"].i for node in graph_def.node
             if node.op in ("While", "StatelessWhile") and not node.name.startswith("gradient_tape/")}
    return sum(swap.element_bytes for swap in loop_accumulators(graph_def)), loops


@pytest.mark.parametrize("keras_class, efficient_class", PAIRS)
def test_the_cells_loop_saves_less_per_step_and_runs_forward_one_iteration_at_a_time(keras_class, efficient_class):
    class StepByStep(keras_class):  # Keras' own cell in the same generic loop: only the differentiation differs
        def __init__(self, units):
            super().__init__(units)
            self._could_use_gpu_kernel = False

    (keras_bytes, keras_loops), (efficient_bytes, loops) = map(_saved_bytes_per_step, (StepByStep, efficient_class))
    assert 0 < efficient_bytes <= keras_bytes / 2, (keras_bytes, efficient_bytes)
    assert keras_loops == {32} and loops == {1}


def _predicted_peak_bytes(layer_class, steps):
    """The simulator's peak for a gradient step of two stacked layers (64 units, batch 32)."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([layer_class(64, return_sequences=True) for _ in range(2)])
    spec = tf.TensorSpec([32, steps, 16])
    model(tf.zeros(spec.shape))

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return loss, tape.gradient(loss, model.trainable_variables)

    return optimize(step, 1e6, input_signature=[spec], calibrate=False).plan.predicted_peak_before_bytes


def test_the_lstm_sequence_keeps_less_than_half_of_kerass_memory_per_step():
    """Predicted growth of the peak from 64 to 256 steps (blocks of 32 steps either way), in [batch, units]
    tensors per step: Keras' LSTM about 24 for its two layers, the memory-efficient one about 9 (each layer's
    input, h and c, the outputs' transposes and, in backward, their gradients)."""
    step_bytes = 32 * 64 * 4
    keras, efficient = ((_predicted_peak_bytes(cls, 256) - _predicted_peak_bytes(cls, 64)) / 192 / step_bytes
                        for cls in (tf.keras.layers.LSTM, MemoryEfficientLSTM))
    assert efficient <= keras / 2, (keras, efficient)


def test_blocks_are_equal_divisors_of_the_steps_within_block_rows():
    cases = [(35, 128), (35, 272), (35, 53), (37, 128), (35, 2000)]
    assert [_blocks(tf.zeros([steps, batch, 1]))[1:] for steps, batch in cases] == [(7, 5), (5, 7), (7, 5), (1, 37),
                                                                                      (1, 35)]


# one block: each pass a loop over blocks holding one over steps, but backward's loop over blocks left out;
# five blocks: backward's last block runs before its loop over the others and starts the weights' sums
@pytest.mark.parametrize("batch, loop_count", [(4, 3), (400, 5)])
def test_the_lstm_sequence_runs_its_loops_one_iteration_at_a_time(batch, loop_count):
    layer = MemoryEfficientLSTM(8)
    inputs = tf.zeros([batch, 10, 3])
    layer(inputs)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        return tape.gradient(loss, layer.trainable_variables)

    graph = step.get_concrete_function(inputs).graph
    loops = [op for function in graph._functions.values() for op in function.graph.get_operations()
             if op.type in ("While", "StatelessWhile")]
    loops += [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert len(loops) == loop_count and {op.get_attr("parallel_iterations") for op in loops} == {1}
    assert not loop_accumulators(graph.as_graph_def())  # nothing saved element by element
    # no zeros of a weight's shape, which Grappler would fold into a constant the function keeps across steps
    weight_shapes = [v.shape for v in layer.weights if v.shape.rank == 2]
    assert not [op.name for op in graph.get_operations() if op.type in ("Const", "Fill", "ZerosLike")
                and op.outputs[0].consumers() and any(op.outputs[0].shape == shape for shape in weight_shapes)]


@pytest.mark.parametrize("keras_cell, efficient_cell", [(tf.keras.layers.LSTMCell, MemoryEfficientLSTMCell),
                                                        (tf.keras.layers.GRUCell, MemoryEfficientGRUCell)])
def test_a_tfa_attention_wrapper_around_the_cell_gives_the_same_gradients(keras_cell, efficient_cell):
    memory = tf.random.stateless_normal([2, 5, 6], seed=[7, 8])
    targets = tf.random.stateless_normal([2, 4, 3], seed=[9, 10])
    results = []
    for cell_class in (keras_cell, efficient_cell):
        tf.keras.utils.set_random_seed(0)
        mechanism = tfa.seq2seq.BahdanauAttention(6, memory=memory)
        cell = tfa.seq2seq.AttentionWrapper(cell_class(6), mechanism, attention_layer_size=6)
        layer = tf.keras.layers.RNN(cell, return_sequences=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(targets) ** 2)
        # the memory layer ran before the tape: its gradient is zero for both
        gradients = tape.gradient(loss, layer.trainable_variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        results.append([loss.numpy()] + [g.numpy() for g in gradients])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
