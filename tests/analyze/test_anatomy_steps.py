"""The loss of real training steps, found by what their graphs compute: the project's NMT step, a tfa
attention seq2seq step and a Keras Transformer written here (neither from the project's models), a step
whose gradient seed the caller gave, and the error when the loss cannot be told apart.

The expected loss is the tensor each step returns (`return loss`), read from the traced graph's output."""

import pytest
import tensorflow as tf
import tensorflow_addons as tfa

from seqmem.analyze.anatomy import analyze_step
from seqmem.edge import capture
from seqmem.errors import NoBackwardPassError

BATCH, STEPS, UNITS, VOCAB = 2, 5, 8, 20


def _graph_and_returned(step, specs):
    """The step's IR graph and the tensor it returns (the input of the function's output `Identity`)."""
    function = capture.concrete_function(step, specs)
    graph = capture.from_tf(function)
    (output,) = graph.outputs
    returned = graph.node(output.node)
    while returned.op == "Identity":
        output, returned = returned.inputs[0], graph.node(returned.inputs[0].node)
    return graph, output


def _tape_step(model, loss_of, output_gradients=None):
    optimizer = tf.keras.optimizers.Adam(1e-3)

    @tf.function(autograph=False)
    def step(*batch):
        with tf.GradientTape() as tape:
            loss = loss_of(model, *batch)
        gradients = tape.gradient(loss, model.trainable_variables, output_gradients=output_gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step


def _token_specs(*shapes):
    return [tf.TensorSpec(shape, tf.int32) for shape in shapes]


def test_the_nmt_steps_loss_is_what_it_returns_and_its_decoder_loop_is_forward():
    from models.nmt.benchmark import training_step

    step, _, specs = training_step(BATCH, STEPS, UNITS, vocab=VOCAB, attention="tfa")
    graph, returned = _graph_and_returned(step, specs)
    anatomy = analyze_step(graph)
    assert anatomy.loss == returned
    # while_v2 names the forward loop's gradient accumulators under gradient_tape/; the loop stays forward
    loops = [name for name in anatomy.forward if graph.node(name).op in ("While", "StatelessWhile")]
    assert loops and all("gradient_tape/" not in name for name in loops)
    assert any(graph.node(name).op in ("While", "StatelessWhile") for name in anatomy.backward)


class _Seq2seq(tf.keras.Model):
    """A Keras LSTM encoder and a tfa AttentionWrapper + Bahdanau (or Luong) decoder, trained teacher-forced."""

    def __init__(self, attention):
        super().__init__()
        self.embed = tf.keras.layers.Embedding(VOCAB, UNITS)
        self.encoder = tf.keras.layers.LSTM(UNITS, return_sequences=True, return_state=True)
        self.attention = attention(UNITS)
        self.cell = tfa.seq2seq.AttentionWrapper(tf.keras.layers.LSTMCell(UNITS), self.attention)
        self.decoder = tfa.seq2seq.BasicDecoder(self.cell, tfa.seq2seq.TrainingSampler(),
                                                output_layer=tf.keras.layers.Dense(VOCAB))

    def call(self, source, target_in):
        memory, h, c = self.encoder(self.embed(source))
        self.attention.setup_memory(memory)
        start = self.cell.get_initial_state(batch_size=BATCH, dtype=tf.float32).clone(cell_state=[h, c])
        outputs, _, _ = self.decoder(self.embed(target_in), initial_state=start,
                                     sequence_length=tf.fill([BATCH], STEPS))
        return outputs.rnn_output


def _seq2seq_loss(model, source, target_in, target_out):
    logits = model(source, target_in)
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target_out, logits, from_logits=True))


@pytest.mark.parametrize("attention", [tfa.seq2seq.BahdanauAttention, tfa.seq2seq.LuongAttention])
def test_a_tfa_seq2seq_steps_loss_is_what_it_returns(attention):
    tf.keras.utils.set_random_seed(0)
    step = _tape_step(_Seq2seq(attention), _seq2seq_loss)
    graph, returned = _graph_and_returned(step, _token_specs([BATCH, STEPS], [BATCH, STEPS], [BATCH, STEPS]))
    anatomy = analyze_step(graph)
    assert anatomy.loss == returned
    assert anatomy.feature_maps and all(ref.node in anatomy.forward for ref in anatomy.feature_maps)


def _transformer(dropout):
    tokens = tf.keras.Input([STEPS], dtype=tf.int32)
    x = tf.keras.layers.Embedding(VOCAB, UNITS)(tokens)
    attended = tf.keras.layers.MultiHeadAttention(2, UNITS // 2, dropout=dropout)(x, x, use_causal_mask=True)
    x = tf.keras.layers.LayerNormalization()(x + attended)
    x = tf.keras.layers.LayerNormalization()(x + tf.keras.layers.Dense(UNITS)(tf.keras.layers.Dense(
        2 * UNITS, activation="relu")(x)))
    return tf.keras.Model(tokens, tf.keras.layers.Dense(VOCAB)(x))


def _lm_loss(model, tokens, targets):
    logits = model(tokens, training=True)
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_keras_transformers_loss_is_what_it_returns(dropout):
    tf.keras.utils.set_random_seed(0)
    step = _tape_step(_transformer(dropout), _lm_loss)
    graph, returned = _graph_and_returned(step, _token_specs([BATCH, STEPS], [BATCH, STEPS]))
    assert analyze_step(graph).loss == returned


def test_a_seed_the_caller_gives_still_finds_the_loss():
    tf.keras.utils.set_random_seed(0)
    step = _tape_step(_transformer(0.0), _lm_loss, output_gradients=tf.constant(0.5))
    graph, returned = _graph_and_returned(step, _token_specs([BATCH, STEPS], [BATCH, STEPS]))
    assert not any(graph.node(name).op == "OnesLike" for name in graph.nodes)
    assert analyze_step(graph).loss == returned


def test_two_losses_differentiated_apart_are_not_guessed():
    tf.keras.utils.set_random_seed(0)
    first, second = tf.keras.layers.Dense(4), tf.keras.layers.Dense(4)
    optimizers = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape(persistent=True) as tape:
            loss_a = tf.reduce_mean(first(x) ** 2)
            loss_b = tf.reduce_mean(second(x) ** 2)
        for loss, layer, optimizer in zip((loss_a, loss_b), (first, second), optimizers):
            optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
        return loss_a + loss_b

    graph, _ = _graph_and_returned(step, [tf.TensorSpec([BATCH, 3])])
    with pytest.raises(NoBackwardPassError, match="loss="):
        analyze_step(graph)
