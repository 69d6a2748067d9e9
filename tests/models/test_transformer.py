import numpy as np
import pytest
import tensorflow as tf

from models.transformer.model import TransformerConfig, TransformerModel, make_train_step, sinusoidal_positions

SMALL = dict(source_vocab=50, target_vocab=40, model_dim=16, heads=2, layers=2, feed_forward=32, max_length=64)


def _batch(seed=0, batch=3, source_steps=7, target_steps=6):
    rng = np.random.default_rng(seed)
    source = tf.constant(rng.integers(1, 50, (batch, source_steps)), tf.int32)
    target = tf.constant(rng.integers(1, 40, (batch, target_steps + 1)), tf.int32)
    source_length = tf.constant([source_steps, 4, 2][:batch], tf.int32)
    target_length = tf.constant([target_steps, 3, 5][:batch], tf.int32)
    return source, source_length, target[:, :-1], target[:, 1:], target_length


def _model(**config):
    model = TransformerModel(TransformerConfig(**{**SMALL, **config}))
    model.build_variables()
    return model


@pytest.mark.parametrize("config, message", [
    (dict(attention="flash"), "attention must be one of"), (dict(loss="fused"), "loss must be one of"),
    (dict(heads=3), "heads must divide model_dim"), (dict(dropout=1.0), "must be in"),
    (dict(loss="efficient", label_smoothing=0.1), "no label smoothing"), (dict(layers=0), "layers must be positive"),
])
def test_config_refuses_bad_values(config, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{**SMALL, **config})


def test_sinusoidal_positions():
    positions = sinusoidal_positions(5, 4)
    np.testing.assert_allclose(positions[:, 0], np.sin(np.arange(5)), rtol=1e-6)
    np.testing.assert_allclose(positions[:, 3], np.cos(np.arange(5) / 100.0), rtol=1e-6)


def test_efficient_attention_and_loss_compute_what_keras_computes():
    """Same weights, no dropout: the token losses and every gradient equal Keras' to float rounding, with
    source padding (a [B, 1, S] mask) and the decoder's causal mask."""
    reference = _model(dropout=0.0)
    source, source_length, target_in, target_out, _ = _batch()
    results = []
    for attention, loss in (("keras", "keras"), ("efficient", "keras"), ("efficient", "efficient")):
        model = _model(dropout=0.0, attention=attention, loss=loss)
        model.set_weights(reference.get_weights())
        with tf.GradientTape() as tape:
            losses = model.token_losses(source, source_length, target_in, target_out, training=True)
            total = tf.reduce_sum(losses)
        gradients = tape.gradient(total, model.trainable_variables)
        results.append([losses, *(tf.convert_to_tensor(g) for g in gradients)])  # embeddings': IndexedSlices
    for other in results[1:]:
        for actual, expected in zip(other, results[0]):
            np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * max(1.0, np.abs(expected).max()))


def test_padding_hides_the_source_beyond_its_length():
    model = _model(dropout=0.0)
    source, source_length, target_in, _, _ = _batch()
    changed = tf.concat([source[:, :2], tf.ones_like(source[:, 2:])], 1)  # sentence 3 has length 2
    np.testing.assert_allclose(model(changed, source_length, target_in)[2], model(source, source_length, target_in)[2],
                               atol=1e-5)


def test_train_step_lowers_the_loss_and_translate_returns_tokens():
    tf.keras.utils.set_random_seed(0)
    model = _model(label_smoothing=0.1)
    step = make_train_step(model, learning_rate=1e-2)
    batch = _batch()
    losses = [float(step(*batch)) for _ in range(8)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    tokens = model.translate(batch[0], batch[1], bos_id=1, eos_id=2, max_length=5)
    assert tokens.shape == (3, 5) and tokens.dtype == tf.int32
    with pytest.raises(ValueError, match="max_length must be in"):
        model.translate(batch[0], batch[1], bos_id=1, eos_id=2, max_length=64)


@pytest.mark.parametrize("argv", [["--time-steps", "128,x"], ["--budget-mb", "0"], ["--precision", "2"],
                                  ["--variants", "swap,all"], ["--variants", "base,flash"], ["--heads", "3"],
                                  ["--layers", "0"], ["--executor", "gpu"]])
def test_benchmark_bad_flags(argv, capsys):
    from models.transformer import benchmark

    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(argv)
    assert exit_info.value.code == 2 and "usage:" in capsys.readouterr().err


def test_one_layer_step_trains_with_either_attention():
    from models.transformer.attention_memory import trains

    assert all(trains(16, layer, 2, 2, 4, 8) for layer in ("keras", "seqmem"))
