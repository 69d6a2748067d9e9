"""MemoryEfficientMultiHeadAttention against Keras' MultiHeadAttention, and blocked_attention itself.

Tolerance: float32 outputs and gradients equal Keras' to 1e-5 of the largest magnitude compared (each row's
softmax sum is taken block by block, in another order than Keras'; measured differences are about 1e-7);
float64 to 1e-12.
"""

import numpy as np
import pytest
import tensorflow as tf

from seqmem.layers.blocked_attention import AttentionMask, blocked_attention
from seqmem.layers.multi_head_attention import MemoryEfficientMultiHeadAttention

B, T, S, DIM = 2, 37, 29, 16


def _close(actual, expected, relative=1e-5):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=0, atol=relative * max(1.0, np.abs(expected).max()))


def _pair(query, value, **config):
    """(Keras' layer, ours with blocks of 8 and Keras' weights), both built on (query, value)."""
    keras_layer = tf.keras.layers.MultiHeadAttention(**config)
    ours = MemoryEfficientMultiHeadAttention(**config, query_block_size=8, key_block_size=8)
    keras_layer(query, value)
    ours(query, value)
    ours.set_weights(keras_layer.get_weights())
    return keras_layer, ours


def _outputs_and_gradients(layer, query, value, **call):
    with tf.GradientTape() as tape:
        tape.watch([query, value])
        output = layer(query, value, **call)
        upstream = tf.cos(tf.reshape(tf.range(tf.size(output), dtype=output.dtype), tf.shape(output)))
        weighted = tf.reduce_sum(output * upstream)  # an upstream gradient other than ones
    return [output, *tape.gradient(weighted, [query, value, *layer.trainable_weights])]


def _inputs(seed=0, length=T, key_length=S):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.normal(size=(B, length, DIM)), tf.float32),
            tf.constant(rng.normal(size=(B, key_length, DIM)), tf.float32))


@pytest.mark.parametrize("config", [
    dict(num_heads=4, key_dim=8),
    dict(num_heads=3, key_dim=8, value_dim=6, output_shape=10),
    dict(num_heads=2, key_dim=4, use_bias=False),
])
@pytest.mark.parametrize("call", ["plain", "causal", "attention_mask", "padding_mask"])
def test_outputs_and_gradients_equal_keras(config, call):
    query, value = _inputs()
    keras_layer, ours = _pair(query, value, **config)
    masks = np.random.default_rng(1).uniform(size=(B, T, S)) > 0.4
    arguments = {"plain": {}, "causal": {"use_causal_mask": True}, "attention_mask": {"attention_mask": masks},
                 "padding_mask": {"attention_mask": masks[:, :1]}}[call]  # [B, 1, S]: broadcast over queries
    for actual, expected in zip(_outputs_and_gradients(ours, query, value, **arguments),
                                _outputs_and_gradients(keras_layer, query, value, **arguments)):
        _close(actual, expected)


def test_variables_and_checkpoints_move_between_the_two(tmp_path):
    query, value = _inputs()
    keras_layer = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attention")
    ours = MemoryEfficientMultiHeadAttention(num_heads=2, key_dim=4, name="attention")
    keras_layer(query, value)
    ours(query, value)
    assert [(v.name, v.shape) for v in ours.weights] == [(v.name, v.shape) for v in keras_layer.weights]
    path = tf.train.Checkpoint(layer=keras_layer).write(str(tmp_path / "keras"))
    tf.train.Checkpoint(layer=ours).read(path).assert_consumed()
    for a, b in zip(ours.weights, keras_layer.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    _close(ours(query, value), keras_layer(query, value))


def test_config_round_trip_and_keras_config_loads():
    query, value = _inputs()
    layer = MemoryEfficientMultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1, query_block_size=16)
    layer(query, value)
    config = layer.get_config()
    restored = MemoryEfficientMultiHeadAttention.from_config(dict(config))  # Keras' from_config edits its argument
    assert restored.get_config() == config
    keras_config = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4).get_config()
    assert MemoryEfficientMultiHeadAttention.from_config(keras_config).get_config()["key_block_size"] is None


def test_keras_masks_and_causal_mask_equal_the_manual_mask():
    """Keras' test_value_mask: the query's and value's Keras masks (and the causal mask) act as the
    [B, T, S] mask they combine into."""
    layer = MemoryEfficientMultiHeadAttention(num_heads=2, key_dim=2, query_block_size=2, key_block_size=2)
    query = tf.keras.layers.Embedding(4, 8, mask_zero=True)(np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2],
                                                                       [1, 0, 0, 0, 0]]))
    value = tf.keras.layers.Embedding(6, 8, mask_zero=True)(np.array([[5, 4, 0], [3, 0, 0], [2, 1, 1]]))
    manual = np.array([[[True, True, False]] * 3 + [[False, False, False]] * 2]
                      + [[[True, False, False]] * 5]
                      + [[[True, True, True]] + [[False, False, False]] * 4])
    causal = np.array([[[True, False, False], [True, True, False]] + [[True, True, True]] * 3])
    for use_causal_mask, mask in ((False, manual), (True, manual & causal)):
        automatic = layer(query=query, value=value, use_causal_mask=use_causal_mask)
        assert np.array_equal(automatic._keras_mask, query._keras_mask)
        plain_query, plain_value = tf.identity(query), tf.identity(value)  # without _keras_mask
        _close(automatic, layer(query=plain_query, value=plain_value, attention_mask=mask))


def test_scores_ragged_and_other_axes_run_keras_computation():
    query, value = _inputs()
    keras_layer, ours = _pair(query, value, num_heads=2, key_dim=4)
    for actual, expected in zip(ours(query, value, return_attention_scores=True),
                                keras_layer(query, value, return_attention_scores=True)):
        np.testing.assert_array_equal(actual, expected)
    ragged = tf.ragged.constant([[[3.0] * DIM, [4.0] * DIM], [[5.0] * DIM]], inner_shape=(DIM,))
    assert ours(ragged, value).shape.as_list() == ragged.shape.as_list()
    high = tf.ones([2, 3, 4, 8])
    layer = MemoryEfficientMultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(1, 2))
    assert layer(high, high).shape == high.shape


def test_dropout_is_reproducible_and_off_outside_training():
    query, value = _inputs()
    layer = MemoryEfficientMultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)
    tf.random.set_seed(7)
    first = layer(query, value, training=True)
    tf.random.set_seed(7)
    again = layer(query, value, training=True)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, layer(query, value, training=False))
    keras_layer = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)
    keras_layer(query, value)
    keras_layer.set_weights(layer.get_weights())
    _close(layer(query, value, training=False), keras_layer(query, value, training=False))


def test_dropout_masks_drop_the_rate_asked_for_and_repeat_for_a_position():
    from seqmem.layers.blocked_attention import _Dropout

    dropout = _Dropout(0.3, tf.constant([5, 6]))
    block = tf.zeros([2, 3, 64, 333])  # an odd number of keys: the last pair of 16-bit draws is cut
    kept = dropout.kept(block, 7).numpy()
    assert kept.shape == (2, 3, 64, 333)
    assert abs((1 - kept.mean()) - 0.3) < 5 * np.sqrt(0.3 * 0.7 / kept.size)  # stateless: the same every run
    np.testing.assert_array_equal(kept, dropout.kept(block, 7))
    assert not np.array_equal(kept, dropout.kept(block, 8))
    assert dropout.scale == pytest.approx(1 / 0.7, rel=1e-4)


def test_dropout_gradients_match_finite_differences():
    """Backward recomputes the masks forward drew: the gradients are those of the function forward
    computes (float64, central differences)."""
    rng = np.random.default_rng(2)
    query, key, value = (tf.constant(rng.normal(size=(1, 7, 2, 2))) for _ in range(3))

    @tf.function  # traced once: central differences call it twice an input element
    def attention(q, k, v):
        return blocked_attention(q, k, v, AttentionMask(causal=True), dropout_rate=0.3,
                                 seed=tf.constant([3, 4]), query_block=3, key_block=3)

    theoretical, numerical = tf.test.compute_gradient(attention, [query, key, value])
    for a, b in zip(theoretical, numerical):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("blocks", [(1, 1), (4, 7), (10, 3), (128, 128)])
def test_blocked_attention_equals_softmax_attention_in_float64(blocks):
    rng = np.random.default_rng(3)
    query = tf.constant(rng.normal(size=(2, 11, 3, 4)))
    key = tf.constant(rng.normal(size=(2, 9, 3, 4)))
    value = tf.constant(rng.normal(size=(2, 9, 3, 5)))
    pairs = tf.constant(rng.uniform(size=(2, 11, 9)) > 0.3)

    def reference(q, k, v):
        scores = tf.einsum("btnh,bsnh->bnts", q, k) + (1.0 - tf.cast(pairs[:, None], tf.float64)) * -1e9
        return tf.einsum("bnts,bsnh->btnh", tf.nn.softmax(scores), v)

    def ours(q, k, v):
        return blocked_attention(q, k, v, AttentionMask(pairs=pairs), query_block=blocks[0], key_block=blocks[1])

    for function in (ours, tf.function(ours)):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([query, key, value])
            actual, expected = function(query, key, value), reference(query, key, value)
            weights = tf.constant(rng.normal(size=actual.shape))
            actual_sum, expected_sum = tf.reduce_sum(actual * weights), tf.reduce_sum(expected * weights)
        _close(actual, expected, 1e-12)
        for a, e in zip(tape.gradient(actual_sum, [query, key, value]),
                        tape.gradient(expected_sum, [query, key, value])):
            _close(a, e, 1e-12)


def test_mixed_precision_computes_in_float32_and_returns_float16():
    query, value = _inputs()
    policy = tf.keras.mixed_precision.Policy("mixed_float16")
    keras_layer, ours = _pair(query, value, num_heads=2, key_dim=4, dtype=policy)
    output = ours(query, value)
    assert output.dtype == tf.float16
    _close(tf.cast(output, tf.float32), tf.cast(keras_layer(query, value), tf.float32), 1e-2)  # Keras: float16
    q, k, v = (tf.cast(tf.random.stateless_normal([2, 12, 2, 4], [i, 0]), tf.float16) for i in range(3))
    output = blocked_attention(q, k, v, query_block=5, key_block=5)
    assert output.dtype == tf.float16
    reference = blocked_attention(*(tf.cast(t, tf.float32) for t in (q, k, v)), query_block=12, key_block=12)
    _close(tf.cast(output, tf.float32), reference, 1e-3)


def test_default_blocks_fit_block_scores_for_known_and_unknown_batches(monkeypatch):
    """Without block sizes, blocks are the largest power of two whose scores fit BLOCK_SCORES for the
    call's batch * heads; where the batch is known only when the step runs, the same size is computed
    in the graph, and the values equal Keras' either way."""
    import seqmem.layers.blocked_attention as module

    assert [module.default_block(n) for n in (1, 4, 160, 1 << 30)] == [2048, 1024, 128, 16]
    assert [int(module.default_block(tf.constant(n))) for n in (1, 4, 160, 1 << 30)] == [2048, 1024, 128, 16]
    monkeypatch.setattr(module, "BLOCK_SCORES", B * 4 * 16 * 16)  # 4 heads: blocks of 16, T = 37 in 3 of them
    query, value = _inputs()
    keras_layer = tf.keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
    ours = MemoryEfficientMultiHeadAttention(num_heads=4, key_dim=8)
    keras_layer(query, value)
    ours(query, value)
    ours.set_weights(keras_layer.get_weights())
    unknown_batch = [tf.TensorSpec([None, *t.shape[1:]], t.dtype) for t in (query, value)]
    for causal in (False, True):
        expected = keras_layer(query, value, use_causal_mask=causal)
        _close(ours(query, value, use_causal_mask=causal), expected)
        traced = tf.function(lambda q, v: ours(q, v, use_causal_mask=causal), input_signature=unknown_batch)  # noqa: B023
        _close(traced(query, value), expected)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="query_block_size must be a positive int or None"):
        MemoryEfficientMultiHeadAttention(num_heads=2, key_dim=4, query_block_size=0)
    q = tf.zeros([1, 4, 2, 3])
    with pytest.raises(ValueError, match="dropout needs a seed"):
        blocked_attention(q, q, q, dropout_rate=0.1)
    with pytest.raises(ValueError, match="dropout_rate must be in"):
        blocked_attention(q, q, q, dropout_rate=1.0, seed=tf.constant([1, 2]))
    with pytest.raises(ValueError, match="shapes do not fit"):
        blocked_attention(q, tf.zeros([1, 4, 2, 5]), q)
    with pytest.raises(ValueError, match=r"must be \[B, T, heads, H\]"):
        blocked_attention(tf.zeros([4, 2, 3]), q, q)


@pytest.mark.device
def test_training_keeps_no_attention_probabilities():
    """One causal self-attention layer trained at T = 512 (8 heads): Keras keeps the [B, 8, T, T]
    probabilities from forward to backward; the blocked layer's measured peak is lower by at least that."""
    from models.transformer.attention_memory import measured
    from seqmem.runtime.device import run_with_budget

    batch, length, heads = 2, 512, 8
    peaks = {}
    for layer in ("keras", "seqmem"):
        run = run_with_budget(measured, length, layer, batch, heads, 16, 128, budget_mb=512)
        assert run.ok, run.message
        peaks[layer] = run.value["peak_bytes"]
    probabilities_bytes = batch * heads * length * length * 4
    assert peaks["seqmem"] < peaks["keras"] - probabilities_bytes
