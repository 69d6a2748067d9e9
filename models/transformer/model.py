"""A Transformer encoder-decoder for translation (Vaswani et al. 2017, pre-norm as most libraries train it).

Token embeddings scaled by sqrt(model_dim) plus sinusoidal positions; `layers` encoder layers (self-attention,
feed-forward) and `layers` decoder layers (causal self-attention, cross-attention, feed-forward), each
sublayer `x + dropout(sublayer(layer_norm(x)))`; a final layer norm and a projection to the target
vocabulary. Attention is Keras' `MultiHeadAttention` or seqmem's `MemoryEfficientMultiHeadAttention`
(same weights); the loss is Keras' cross-entropy over the [B, T, V] logits (label smoothing optional) or
seqmem's blocked one from the decoder's outputs (`seqmem.layers.softmax_loss`, same projection weights).
The training step has the signature of `models.nmt`'s, so both share the data pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from seqmem.layers.multi_head_attention import MemoryEfficientMultiHeadAttention
from seqmem.layers.softmax_loss import projected_sparse_cross_entropy

__all__ = ["ATTENTIONS", "LOSSES", "TransformerConfig", "TransformerModel", "make_train_step"]

ATTENTIONS = {"keras": tf.keras.layers.MultiHeadAttention, "efficient": MemoryEfficientMultiHeadAttention}
LOSSES = ("keras", "efficient")


@dataclass(frozen=True)
class TransformerConfig:
    """Model sizes. heads must divide model_dim; attention: "keras" or "efficient"; loss: "keras" (the
    [B, T, V] logits) or "efficient" (blocked, no label smoothing); dropout: of every sublayer's output
    and of the attention probabilities; max_length: the longest sequence the positions cover."""

    source_vocab: int = 8000
    target_vocab: int = 8000
    model_dim: int = 256
    heads: int = 4
    layers: int = 4
    feed_forward: int = 1024
    dropout: float = 0.1
    label_smoothing: float = 0.0
    max_length: int = 1024
    attention: str = "keras"
    loss: str = "keras"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {sorted(ATTENTIONS)}, got {self.attention!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {list(LOSSES)}, got {self.loss!r}")
        for name in ("source_vocab", "target_vocab", "model_dim", "heads", "layers", "feed_forward", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.model_dim % self.heads:
            raise ValueError(f"heads must divide model_dim, got {self.heads} heads for {self.model_dim}")
        if not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"dropout and label_smoothing must be in [0, 1), got {self.dropout}, {self.label_smoothing}")
        if self.loss == "efficient" and self.label_smoothing:
            raise ValueError("the blocked loss has no label smoothing: use loss='keras' or label_smoothing=0")


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
    """[length, dim] float32: sin of position / 10000^(2i / dim) in the even columns, cos in the odd."""
    angles = np.arange(length)[:, None] / np.power(10000.0, (np.arange(dim)[None, :] // 2 * 2) / dim)
    return np.where(np.arange(dim) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


class _Sublayer(tf.keras.layers.Layer):
    """x + dropout(f(layer_norm(x), ...)), pre-norm."""

    def __init__(self, function: tf.keras.layers.Layer, dropout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.norm = tf.keras.layers.LayerNormalization(epsilon=1e-6)
        self.function = function
        self.dropout = tf.keras.layers.Dropout(dropout)

    def call(self, x, *args, training=False, **kwargs):
        return x + self.dropout(self.function(self.norm(x), *args, training=training, **kwargs), training=training)


class _FeedForward(tf.keras.layers.Layer):
    def __init__(self, config: TransformerConfig, **kwargs) -> None:
        super().__init__(**kwargs)
        self.inner = tf.keras.layers.Dense(config.feed_forward, activation="relu")
        self.outer = tf.keras.layers.Dense(config.model_dim)

    def call(self, x, training=False):
        return self.outer(self.inner(x))


class _SelfAttention(tf.keras.layers.Layer):
    """Attention of x to itself (or, given `memory`, to the memory), for `_Sublayer`."""

    def __init__(self, config: TransformerConfig, causal: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.attention = ATTENTIONS[config.attention](config.heads, config.model_dim // config.heads,
                                                      dropout=config.dropout)
        self.causal = causal

    def call(self, x, memory=None, padding=None, training=False):
        value = x if memory is None else memory
        return self.attention(x, value, attention_mask=padding, use_causal_mask=self.causal, training=training)


class TransformerModel(tf.keras.Model):
    """call(source, source_length, target_in, training) -> logits [B, T_tgt, V];
    token_losses(source, source_length, target_in, target_out, training) -> cross-entropy [B, T_tgt];
    translate(source, source_length, bos_id, eos_id, max_length) -> greedy token ids [B, max_length]."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.source_embedding = tf.keras.layers.Embedding(config.source_vocab, config.model_dim)
        self.target_embedding = tf.keras.layers.Embedding(config.target_vocab, config.model_dim)
        self.positions = tf.constant(sinusoidal_positions(config.max_length, config.model_dim))
        self.dropout = tf.keras.layers.Dropout(config.dropout)
        sublayer = lambda function: _Sublayer(function, config.dropout)  # noqa: E731
        self.encoder = [(sublayer(_SelfAttention(config, causal=False)), sublayer(_FeedForward(config)))
                        for _ in range(config.layers)]
        self.decoder = [(sublayer(_SelfAttention(config, causal=True)), sublayer(_SelfAttention(config, causal=False)),
                         sublayer(_FeedForward(config))) for _ in range(config.layers)]
        self.encoder_norm = tf.keras.layers.LayerNormalization(epsilon=1e-6)
        self.decoder_norm = tf.keras.layers.LayerNormalization(epsilon=1e-6)
        self.projection = tf.keras.layers.Dense(config.target_vocab)

    def build_variables(self) -> None:
        """Create every weight now (one eager call on one-token sentences), as the first call would."""
        token = tf.ones([1, 1], tf.int32)
        self(token, tf.ones([1], tf.int32), token)

    def _embedded(self, embedding, tokens, training):
        length = tf.shape(tokens)[1]
        scaled = embedding(tokens) * math.sqrt(self.config.model_dim)
        return self.dropout(scaled + self.positions[tf.newaxis, :length], training=training)

    def _decoded(self, source, source_length, target_in, training):
        """The decoder's normalized outputs [B, T_tgt, model_dim]."""
        padding = tf.sequence_mask(source_length, tf.shape(source)[1])[:, tf.newaxis, :]  # [B, 1, S]
        memory = self._embedded(self.source_embedding, source, training)
        for attention, feed_forward in self.encoder:
            memory = feed_forward(attention(memory, padding=padding, training=training), training=training)
        memory = self.encoder_norm(memory)
        x = self._embedded(self.target_embedding, target_in, training)
        for attention, cross_attention, feed_forward in self.decoder:
            x = attention(x, training=training)
            x = cross_attention(x, memory=memory, padding=padding, training=training)
            x = feed_forward(x, training=training)
        return self.decoder_norm(x)

    def call(self, source, source_length, target_in, training=False):
        return self.projection(self._decoded(source, source_length, target_in, training))

    def token_losses(self, source, source_length, target_in, target_out, training=False):
        """Teacher-forced cross-entropy of each target token [B, T_tgt] (config.loss says how)."""
        if self.config.loss == "efficient":
            outputs = self._decoded(source, source_length, target_in, training)
            return projected_sparse_cross_entropy(outputs, target_out, self.projection.kernel, self.projection.bias)
        logits = self(source, source_length, target_in, training=training)
        if not self.config.label_smoothing:
            return tf.keras.losses.sparse_categorical_crossentropy(target_out, logits, from_logits=True)
        labels = tf.one_hot(target_out, self.config.target_vocab, dtype=logits.dtype)
        return tf.keras.losses.categorical_crossentropy(labels, logits, from_logits=True,
                                                        label_smoothing=self.config.label_smoothing)

    def translate(self, source, source_length, bos_id: int, eos_id: int, max_length: int):
        """Greedy translations [B, max_length]: each step decodes the whole prefix again (no cache);
        positions after a sentence's `eos_id` repeat it."""
        if not 1 <= max_length <= self.config.max_length - 1:
            raise ValueError(f"max_length must be in [1, {self.config.max_length - 1}], got {max_length}")
        batch = tf.shape(source)[0]
        tokens = tf.fill([batch, 1], bos_id)
        for _ in range(max_length):
            logits = self(source, source_length, tokens)[:, -1]
            finished = tf.equal(tokens[:, -1], eos_id) & (tf.shape(tokens)[1] > 1)
            next_token = tf.where(finished, eos_id, tf.argmax(logits, -1, output_type=tf.int32))
            tokens = tf.concat([tokens, next_token[:, tf.newaxis]], 1)
        return tokens[:, 1:]


def make_train_step(model: TransformerModel, learning_rate: float = 1e-3):
    """A tf.function (source, source_length, target_in, target_out, target_length) -> loss (the mean over
    each sentence's first target_length tokens), updating `model` with Adam."""
    from models.nmt.model import masked_mean

    optimizer = tf.keras.optimizers.Adam(learning_rate)
    model.build_variables()  # every variable before the first trace: created during it, they retrace the step
    optimizer.build(model.trainable_variables)

    @tf.function(autograph=False)
    def train_step(source, source_length, target_in, target_out, target_length):
        with tf.GradientTape() as tape:
            losses = model.token_losses(source, source_length, target_in, target_out, training=True)
            loss = masked_mean(losses, target_length)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step
