"""Attention NMT as in the TensorFlow NMT tutorial: embeddings, an LSTM encoder, an
LSTM decoder wrapped in `tfa.seq2seq.AttentionWrapper` with additive attention
(tfa's `BahdanauAttention` or seqmem's `MemoryEfficientBahdanauAttention`),
`BasicDecoder` + `TrainingSampler` for teacher-forced training, and a masked
cross-entropy loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf
import tensorflow_addons as tfa

from seqmem.attention import MemoryEfficientBahdanauAttention

__all__ = ["ATTENTIONS", "NMTConfig", "NMTModel", "make_train_step", "masked_cross_entropy"]

ATTENTIONS = {"tfa": tfa.seq2seq.BahdanauAttention, "efficient": MemoryEfficientBahdanauAttention}


@dataclass(frozen=True)
class NMTConfig:
    """Model sizes. attention: "tfa" or "efficient"."""

    source_vocab: int = 1000
    target_vocab: int = 1000
    units: int = 256
    attention: str = "tfa"
    normalize: bool = False

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {sorted(ATTENTIONS)}, got {self.attention!r}")
        for name in ("source_vocab", "target_vocab", "units"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class NMTModel(tf.keras.Model):
    """call(source, source_length, target_in) -> (logits [B, T_tgt, V], final alignments [B, T_src])."""

    def __init__(self, config: NMTConfig) -> None:
        super().__init__()
        self.config = config
        self.source_embedding = tf.keras.layers.Embedding(config.source_vocab, config.units)
        self.target_embedding = tf.keras.layers.Embedding(config.target_vocab, config.units)
        self.encoder = tf.keras.layers.LSTM(config.units, return_sequences=True, return_state=True)
        self.attention = ATTENTIONS[config.attention](config.units, normalize=config.normalize)
        self.cell = tfa.seq2seq.AttentionWrapper(
            tf.keras.layers.LSTMCell(config.units), self.attention, attention_layer_size=config.units
        )
        self.decoder = tfa.seq2seq.BasicDecoder(
            self.cell, tfa.seq2seq.TrainingSampler(), output_layer=tf.keras.layers.Dense(config.target_vocab)
        )

    def call(self, source, source_length, target_in):
        source_mask = tf.sequence_mask(source_length, tf.shape(source)[1])
        memory, h, c = self.encoder(self.source_embedding(source), mask=source_mask)
        self.attention.setup_memory(memory, memory_sequence_length=source_length)
        batch = tf.shape(source)[0]
        initial = self.cell.get_initial_state(batch_size=batch, dtype=memory.dtype).clone(cell_state=[h, c])
        target_length = tf.fill([batch], tf.shape(target_in)[1])
        outputs, state, _ = self.decoder(
            self.target_embedding(target_in), initial_state=initial, sequence_length=target_length
        )
        return outputs.rnn_output, state.alignments


def masked_cross_entropy(target_out, logits, target_length):
    """Mean token cross-entropy over the first `target_length` positions of each sentence."""
    mask = tf.sequence_mask(target_length, tf.shape(target_out)[1], dtype=logits.dtype)
    losses = tf.keras.losses.sparse_categorical_crossentropy(target_out, logits, from_logits=True)
    return tf.reduce_sum(losses * mask) / tf.reduce_sum(mask)


def make_train_step(model: NMTModel, learning_rate: float = 1e-3):
    """A tf.function (source, source_length, target_in, target_out, target_length) -> loss, updating `model`."""
    optimizer = tf.keras.optimizers.Adam(learning_rate)

    @tf.function
    def train_step(source, source_length, target_in, target_out, target_length):
        with tf.GradientTape() as tape:
            logits, _ = model(source, source_length, target_in)
            loss = masked_cross_entropy(target_out, logits, target_length)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step
