"""The loss of real training steps, found by what their graphs compute: the project's NMT step, a tfa
attention seq2seq step and a Keras Transformer written here (neither from the project's models), a step
whose gradient seed the caller gave, and steps with several losses: a sum, a list, a GAN's two tapes.

The expected loss is the tensor each step returns (`return loss`), read from the traced graph's output."""

import pytest
import tensorflow as tf
import tensorflow_addons as tfa

from seqmem.analyze.anatomy import analyze_step
from seqmem.edge import capture
from seqmem.ir.graph import TensorRef

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
    assert anatomy.losses == (returned,)
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
    assert anatomy.losses == (returned,)
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
    assert analyze_step(graph).losses == (returned,)


def test_a_seed_the_caller_gives_still_finds_the_loss():
    tf.keras.utils.set_random_seed(0)
    step = _tape_step(_transformer(0.0), _lm_loss, output_gradients=tf.constant(0.5))
    graph, returned = _graph_and_returned(step, _token_specs([BATCH, STEPS], [BATCH, STEPS]))
    assert not any(graph.node(name).op == "OnesLike" for name in graph.nodes)
    assert analyze_step(graph).losses == (returned,)


def _two_heads():
    """A Dense trunk with two heads: (model, SGD optimizer)."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input([3])
    hidden = tf.keras.layers.Dense(8, activation="relu")(inputs)
    model = tf.keras.Model(inputs, [tf.keras.layers.Dense(1)(hidden), tf.keras.layers.Dense(4)(hidden)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _losses(graph, *roots):
    """The scalar terms of the losses the step returns summed: `roots`' nodes, or the Keras loss values
    under each of those name scopes."""
    return tuple(sorted(TensorRef(name, 0) for name in graph.nodes
                        if any(name == f"{root}/weighted_loss/value" for root in roots)))


_BCE = tf.keras.losses.BinaryCrossentropy(from_logits=True)
_SCCE = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
_HEAD_SPECS = [tf.TensorSpec([BATCH, 3]), tf.TensorSpec([BATCH, 1]), tf.TensorSpec([BATCH], tf.int32)]


@pytest.mark.parametrize("as_list", [False, True])
def test_a_sum_or_a_list_of_keras_losses_is_planned_for_by_its_terms(as_list):
    """`tape.gradient(a + b, ...)` or `tape.gradient([a, b], ...)`: the gradient of a sum of two scalars is its
    seed, so either way the seeds are read by the terms' gradients."""
    model, optimizer = _two_heads()

    @tf.function(autograph=False)
    def step(x, clicks, classes):
        with tf.GradientTape() as tape:
            click_logits, class_logits = model(x, training=True)
            losses = [_BCE(clicks, click_logits), _SCCE(classes, class_logits)]
            target = losses if as_list else losses[0] + losses[1]
        optimizer.apply_gradients(zip(tape.gradient(target, model.trainable_variables), model.trainable_variables))
        return losses[0] + losses[1]

    graph, _ = _graph_and_returned(step, _HEAD_SPECS)
    anatomy = analyze_step(graph)
    assert sorted(anatomy.losses) == list(_losses(graph, "binary_crossentropy", "sparse_categorical_crossentropy"))
    assert all(ref.node in anatomy.forward for ref in anatomy.feature_maps) and anatomy.feature_maps


def test_a_gans_two_tapes_give_both_losses():
    """The TensorFlow DCGAN tutorial's step, small: a generator's and a discriminator's losses, each
    differentiated by its own tape; the generator's gradient runs back through the discriminator."""
    tf.keras.utils.set_random_seed(0)
    generator = tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(6, activation="relu")])
    discriminator = tf.keras.Sequential([tf.keras.Input([6]), tf.keras.layers.Dense(1)])
    optimizers = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.Adam(1e-3)
    for optimizer, model in zip(optimizers, (generator, discriminator)):
        optimizer.build(model.trainable_variables)

    @tf.function(autograph=False)
    def step(real):
        noise = tf.random.normal([BATCH, 4])
        with tf.GradientTape() as generator_tape, tf.GradientTape() as discriminator_tape:
            real_out, fake_out = discriminator(real, training=True), discriminator(generator(noise, training=True))
            generator_loss = _BCE(tf.ones_like(fake_out), fake_out)
            discriminator_loss = _BCE(tf.ones_like(real_out), real_out) + _BCE(tf.zeros_like(fake_out), fake_out)
        for tape, loss, model, optimizer in zip((generator_tape, discriminator_tape),
                                                (generator_loss, discriminator_loss),
                                                (generator, discriminator), optimizers):
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return generator_loss + discriminator_loss

    graph, _ = _graph_and_returned(step, [tf.TensorSpec([BATCH, 6])])
    anatomy = analyze_step(graph)
    expected = _losses(graph, "binary_crossentropy", "binary_crossentropy_1", "binary_crossentropy_2")
    assert len(expected) == 3 and sorted(anatomy.losses) == list(expected)
    # the generator's activation (the only ReLU) and its noise are feature maps: its gradient reads them
    assert "Relu" in {graph.node(ref.node).op for ref in anatomy.feature_maps}
    assert "random_normal" in {ref.node for ref in anatomy.feature_maps}
