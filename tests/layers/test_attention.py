import numpy as np
import pytest
import tensorflow as tf
import tensorflow_addons as tfa

from seqmem.layers.attention import MemoryEfficientBahdanauAttention

BATCH, SOURCE_LEN, TARGET_LEN, UNITS, VOCAB = 3, 7, 5, 8, 11


class Seq2Seq(tf.keras.Model):
    """Embedding + LSTM encoder; LSTM decoder in an AttentionWrapper with BasicDecoder + TrainingSampler."""

    def __init__(self, attention_class, normalize):
        super().__init__()
        self.embedding = tf.keras.layers.Embedding(VOCAB, UNITS)
        self.encoder = tf.keras.layers.LSTM(UNITS, return_sequences=True, return_state=True)
        self.attention = attention_class(UNITS, normalize=normalize)
        self.cell = tfa.seq2seq.AttentionWrapper(
            tf.keras.layers.LSTMCell(UNITS), self.attention, attention_layer_size=UNITS
        )
        self.decoder = tfa.seq2seq.BasicDecoder(
            self.cell, tfa.seq2seq.TrainingSampler(), output_layer=tf.keras.layers.Dense(VOCAB)
        )

    def call(self, source, source_length, target):
        memory, h, c = self.encoder(self.embedding(source), mask=tf.sequence_mask(source_length, SOURCE_LEN))
        self.attention.setup_memory(memory, memory_sequence_length=source_length)
        initial = self.cell.get_initial_state(batch_size=BATCH, dtype=tf.float32).clone(cell_state=[h, c])
        outputs, state, _ = self.decoder(
            self.embedding(target), initial_state=initial, sequence_length=tf.fill([BATCH], TARGET_LEN)
        )
        return outputs.rnn_output, state.alignments


def _data(masked):
    rng = np.random.default_rng(0)
    source = tf.constant(rng.integers(0, VOCAB, (BATCH, SOURCE_LEN)), tf.int32)
    target = tf.constant(rng.integers(0, VOCAB, (BATCH, TARGET_LEN)), tf.int32)
    lengths = tf.constant([SOURCE_LEN, 4, 2] if masked else [SOURCE_LEN] * BATCH, tf.int32)
    return source, lengths, target


def _loss_and_grads(model, data):
    source, lengths, target = data
    with tf.GradientTape() as tape:
        logits, alignments = model(source, lengths, target)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return loss, alignments, grads


def _pair(normalize, data):
    tf.keras.utils.set_random_seed(1)
    reference = Seq2Seq(tfa.seq2seq.BahdanauAttention, normalize)
    ours = Seq2Seq(MemoryEfficientBahdanauAttention, normalize)
    reference(*data)
    ours(*data)
    ours.set_weights(reference.get_weights())
    return reference, ours


# every option eagerly; in a tf.function (tfa's decoder traced, most of this test's time) once, with all of them
@pytest.mark.parametrize("normalize, masked, graph_mode", [
    (False, False, False), (False, True, False), (True, False, False), (True, True, False), (True, True, True)])
def test_alignments_and_every_gradient_match_tfa(normalize, masked, graph_mode):
    data = _data(masked)
    reference, ours = _pair(normalize, data)
    strip = lambda variables: [("/".join(v.name.split("/")[-2:]), v.shape) for v in variables]  # noqa: E731
    assert strip(ours.attention.variables) == strip(reference.attention.variables)
    run = tf.function(_loss_and_grads) if graph_mode else _loss_and_grads
    ref_loss, ref_align, ref_grads = run(reference, data)
    loss, align, grads = run(ours, data)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(align, ref_align, rtol=1e-5, atol=1e-7)
    for variable, expected, got in zip(reference.trainable_variables, ref_grads, grads):
        np.testing.assert_allclose(tf.convert_to_tensor(got), tf.convert_to_tensor(expected), rtol=1e-5, atol=1e-6,
                                   err_msg=variable.name)


def test_checkpoint_moves_between_tfa_and_ours(tmp_path):
    data = _data(True)
    reference, ours = _pair(True, data)
    for variable in reference.attention.trainable_variables:
        variable.assign(variable + 0.5)
    path = tf.train.Checkpoint(model=reference).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=ours).read(path).assert_existing_objects_matched()
    for a, b in zip(reference.attention.variables, ours.attention.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_config_round_trip():
    layer = MemoryEfficientBahdanauAttention(6, normalize=True, probability_fn="hardmax")
    clone = MemoryEfficientBahdanauAttention.from_config(layer.get_config())
    assert isinstance(clone, MemoryEfficientBahdanauAttention)
    assert (clone.units, clone.normalize, clone.probability_fn_name) == (6, True, "hardmax")


def test_same_errors_as_tfa_for_the_same_misuse():
    memory = tf.zeros([2, 4, 3])
    messages = []
    for cls in (tfa.seq2seq.BahdanauAttention, MemoryEfficientBahdanauAttention):
        with pytest.raises(ValueError) as error:
            cls(5, memory=memory).setup_memory(memory, memory_sequence_length=[4, 4], memory_mask=tf.ones([2, 4], bool))
        messages.append(str(error.value))
        with pytest.raises(Exception) as error:
            cls(5, probability_fn="sparsemax")
        messages.append(type(error.value).__name__ + str(error.value))
    assert messages[0] == messages[2] and messages[1] == messages[3]


def median_step_peak_bytes(attention: str, batch: int, time_steps: int, units: int) -> int:
    """Child process: median measured peak of 5 NMT training steps (after a warm-up)."""
    from models.nmt.benchmark import training_step
    from seqmem.runtime.measure import timed_steps

    step, inputs, _ = training_step(batch, time_steps, units, vocab=1000, attention=attention)
    peaks, _ = timed_steps(step, inputs, 5)
    return sorted(peaks)[2]


@pytest.mark.device
def test_measured_peak_shows_the_saving_on_the_emulated_device():
    from seqmem.runtime.device import run_with_budget

    peaks = {}
    for attention in ("tfa", "efficient"):
        # TensorFlow's inter-op pool: on one stream the gradient loop's order varies far more (one stream,
        # 3 runs: tfa 73-140 MB, efficient 132-172 MB; the pool, 2 runs: tfa 101-103, efficient 82-86)
        run = run_with_budget(median_step_peak_bytes, attention, 8, 50, 256, budget_mb=2048, one_stream=False)
        assert run.ok, run.message
        peaks[attention] = run.value
    # tfa keeps a [8, 50, 256] float32 tanh output (400 KiB) for each of 50 decoder steps: 19.5 MiB
    assert peaks["tfa"] - peaks["efficient"] > 10 << 20, peaks


@pytest.mark.parametrize("beam", [False, True])
def test_inference_decoders_run_with_the_efficient_attention(beam):
    tf.keras.utils.set_random_seed(2)
    memory = tf.random.normal([BATCH, SOURCE_LEN, UNITS])
    lengths = tf.constant([SOURCE_LEN, 4, 2])
    embedding = tf.keras.layers.Embedding(VOCAB, UNITS)
    width = 3 if beam else 1
    attention = MemoryEfficientBahdanauAttention(
        UNITS,
        memory=tfa.seq2seq.tile_batch(memory, width) if beam else memory,
        memory_sequence_length=tfa.seq2seq.tile_batch(lengths, width) if beam else lengths,
    )
    cell = tfa.seq2seq.AttentionWrapper(tf.keras.layers.LSTMCell(UNITS), attention, attention_layer_size=UNITS)
    start = tf.fill([BATCH], 1)
    if beam:
        decoder = tfa.seq2seq.BeamSearchDecoder(cell, beam_width=width, output_layer=tf.keras.layers.Dense(VOCAB),
                                                maximum_iterations=6)
        initial = cell.get_initial_state(batch_size=BATCH * width, dtype=tf.float32)
        embedding.build((None,))
        outputs, _, _ = decoder(embedding.embeddings, start_tokens=start, end_token=0, initial_state=initial)
        assert outputs.predicted_ids.shape[0] == BATCH and outputs.predicted_ids.shape[-1] == width
    else:
        decoder = tfa.seq2seq.BasicDecoder(cell, tfa.seq2seq.GreedyEmbeddingSampler(embedding),
                                           output_layer=tf.keras.layers.Dense(VOCAB), maximum_iterations=6)
        initial = cell.get_initial_state(batch_size=BATCH, dtype=tf.float32)
        outputs, _, _ = decoder(None, start_tokens=start, end_token=0, initial_state=initial)
        assert outputs.sample_id.shape[0] == BATCH


def test_keras_rnn_and_mixed_precision_match_tfa():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        results = []
        for cls in (tfa.seq2seq.BahdanauAttention, MemoryEfficientBahdanauAttention):
            tf.keras.utils.set_random_seed(3)
            memory = tf.random.normal([BATCH, SOURCE_LEN, UNITS])
            attention = cls(UNITS, memory=memory)
            cell = tfa.seq2seq.AttentionWrapper(tf.keras.layers.LSTMCell(UNITS), attention, attention_layer_size=UNITS)
            layer = tf.keras.layers.RNN(cell)
            inputs = tf.random.normal([BATCH, TARGET_LEN, UNITS])
            with tf.GradientTape() as tape:
                output = layer(inputs)
                loss = tf.reduce_sum(tf.cast(output, tf.float32))
            grads = tape.gradient(loss, layer.trainable_variables)
            results.append((output, grads))
        (ref_out, ref_grads), (out, grads) = results
        assert out.dtype == tf.float16
        # float16: tolerance of a few half-precision ulps
        np.testing.assert_allclose(np.float32(out), np.float32(ref_out), rtol=1e-2, atol=1e-2)
        assert [g is None for g in grads] == [g is None for g in ref_grads]
        for a, b in zip(ref_grads, grads):
            if a is None:
                continue
            np.testing.assert_allclose(np.float32(tf.convert_to_tensor(b)), np.float32(tf.convert_to_tensor(a)),
                                       rtol=2e-2, atol=2e-2)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
