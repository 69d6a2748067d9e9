"""Memory-efficient additive (Bahdanau) attention for tensorflow-addons 0.23.

`tfa.seq2seq.BahdanauAttention` scores a query against the keys as

    score[b, t] = sum_u  w[u] * tanh(keys[b, t, u] + q[b, u] (+ bias[u]))

(`w` is `attention_v`, or its weight-normalised form). Autodiff keeps the
`[batch, max_time, units]` tanh output of every decoder step for the backward
pass, so training stores O(T_dec * B * T_enc * units). Here the score is a
`tf.custom_gradient` function whose backward recomputes the tanh from `keys`
(loop-invariant) and the `[batch, units]` query, so a decoder step keeps only
its query: O(T_dec * B * units) plus the keys once. The recomputation waits for
the step's incoming gradient (a control edge): otherwise the gradient loop,
which runs up to 32 iterations at once, would recompute many steps' energies
ahead of time and hold them together.

`MemoryEfficientBahdanauAttention` subclasses tfa's class and changes only how
the score is differentiated: constructor, `setup_memory`, call contract,
config, variables (names and shapes) and error messages are tfa's own, so a
checkpoint written with one loads into the other.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_addons as tfa

__all__ = ["MemoryEfficientBahdanauAttention", "additive_score"]


@tf.custom_gradient
def _score(processed_query, keys, weight):
    """sum(weight * tanh(keys + query), axis=2); backward recomputes the tanh."""
    score = _weighted_sum(tf.tanh(keys + processed_query[:, tf.newaxis, :]), weight)

    def grad(d_score):
        with tf.control_dependencies([d_score]):  # recompute only when this step's gradient arrives
            energy = tf.tanh(keys + processed_query[:, tf.newaxis, :])
        d_pre, d_weight = _energy_gradients(d_score, energy, weight)
        return tf.reduce_sum(d_pre, axis=1), d_pre, d_weight

    return score, grad


@tf.custom_gradient
def _score_with_bias(processed_query, keys, weight, bias):
    """sum(weight * tanh(keys + query + bias), axis=2); backward recomputes the tanh."""
    score = _weighted_sum(tf.tanh(keys + (processed_query + bias)[:, tf.newaxis, :]), weight)

    def grad(d_score):
        with tf.control_dependencies([d_score]):  # recompute only when this step's gradient arrives
            energy = tf.tanh(keys + (processed_query + bias)[:, tf.newaxis, :])
        d_pre, d_weight = _energy_gradients(d_score, energy, weight)
        d_query = tf.reduce_sum(d_pre, axis=1)
        return d_query, d_pre, d_weight, tf.reduce_sum(d_query, axis=0)

    return score, grad


def _weighted_sum(energy, weight):
    """[B, T, U] x [U] -> [B, T] without a [B, T, U] product."""
    return tf.einsum("btu,u->bt", energy, weight)


def _energy_gradients(d_score, energy, weight):
    """Gradients w.r.t. the pre-activation [B, T, U] and the score weight [U].

    One [B, T, U] temporary besides `energy`: TanhGrad may write into it.
    """
    d_pre = tf.raw_ops.TanhGrad(y=energy, dy=d_score[:, :, tf.newaxis] * weight)
    d_weight = tf.einsum("bt,btu->u", d_score, energy)
    return d_pre, d_weight


def additive_score(processed_query, keys, attention_v, attention_g=None, attention_b=None):
    """tfa's `_bahdanau_score`, computed without storing `[batch, max_time, units]` for backward.

    processed_query: [batch, units]; keys: [batch, max_time, units];
    attention_v: [units]; attention_g (scalar) and attention_b ([units]) for the
    normalised form. Returns the [batch, max_time] unnormalised scores.
    """
    if attention_g is not None and attention_b is not None:
        weight = attention_g * attention_v * tf.math.rsqrt(tf.reduce_sum(tf.square(attention_v)))
        return _score_with_bias(processed_query, keys, weight, tf.convert_to_tensor(attention_b))
    return _score(processed_query, keys, tf.convert_to_tensor(attention_v))


@tf.keras.utils.register_keras_serializable(package="seqmem")
class MemoryEfficientBahdanauAttention(tfa.seq2seq.BahdanauAttention):
    """Drop-in for `tfa.seq2seq.BahdanauAttention` whose backward pass recomputes the energies.

    Takes the same arguments (`units`, `memory`, `memory_sequence_length`,
    `normalize`, `probability_fn`, `kernel_initializer`, `dtype`, `name`, and
    `query_layer` / `memory_layer` through kwargs) and computes the same values
    and gradients; see the module docstring for the memory it saves.
    """

    def _calculate_attention(self, query, state):
        processed_query = self.query_layer(query) if self.query_layer else query
        score = additive_score(
            processed_query,
            self.keys,
            self.attention_v,
            attention_g=self.attention_g,
            attention_b=self.attention_b,
        )
        alignments = self.probability_fn(score, state)
        return alignments, alignments
