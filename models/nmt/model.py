"""Attention NMT as in the TensorFlow NMT tutorial: embeddings, an LSTM encoder of
`layers` layers (the first bidirectional if asked), an LSTM decoder of `layers`
layers wrapped in `tfa.seq2seq.AttentionWrapper` with additive attention (tfa's
`BahdanauAttention` or seqmem's `MemoryEfficientBahdanauAttention`), Keras' LSTM layers and
cells or seqmem's memory-efficient ones (same weights, recomputed in backward),
`BasicDecoder` + `TrainingSampler` for teacher-forced training, greedy and
beam-search decoding for inference, and a masked cross-entropy loss, over Keras'
full [B, T, V] logits or block by block from the decoder's outputs
(`seqmem.layers.softmax_loss`, same projection weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf
import tensorflow_addons as tfa

from seqmem.layers.attention import MemoryEfficientBahdanauAttention
from seqmem.layers.recurrent import MemoryEfficientLSTM, MemoryEfficientLSTMCell
from seqmem.layers.softmax_loss import projected_sparse_cross_entropy

__all__ = ["ATTENTIONS", "CELLS", "LOSSES", "NMTConfig", "NMTModel", "make_train_step", "masked_cross_entropy",
           "masked_mean"]

ATTENTIONS = {"tfa": tfa.seq2seq.BahdanauAttention, "efficient": MemoryEfficientBahdanauAttention}
# (encoder layer, decoder cell) of each kind of recurrent cell
CELLS = {"keras": (tf.keras.layers.LSTM, tf.keras.layers.LSTMCell),
         "efficient": (MemoryEfficientLSTM, MemoryEfficientLSTMCell)}
# how the training loss is computed: from the decoder's [B, T, V] logits, or block by block from its outputs
LOSSES = ("keras", "efficient")


@dataclass(frozen=True)
class NMTConfig:
    """Model sizes. attention: "tfa" or "efficient"; cells: "keras" or "efficient" (encoder and decoder);
    loss: "keras" (the decoder projects every step to logits) or "efficient" (`token_losses` projects the
    decoder's outputs block by block, `seqmem.layers.softmax_loss`)."""

    source_vocab: int = 1000
    target_vocab: int = 1000
    units: int = 256
    attention: str = "tfa"
    normalize: bool = False
    layers: int = 1
    bidirectional: bool = False
    cells: str = "keras"
    loss: str = "keras"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {sorted(ATTENTIONS)}, got {self.attention!r}")
        if self.cells not in CELLS:
            raise ValueError(f"cells must be one of {sorted(CELLS)}, got {self.cells!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {list(LOSSES)}, got {self.loss!r}")
        for name in ("source_vocab", "target_vocab", "units", "layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.bidirectional and self.units % 2:
            raise ValueError(f"a bidirectional encoder splits units between directions: units must be even, got {self.units}")


class NMTModel(tf.keras.Model):
    """call(source, source_length, target_in) -> (logits [B, T_tgt, V], final alignments [B, T_src]);
    token_losses(source, source_length, target_in, target_out) -> cross-entropy [B, T_tgt];
    translate(source, source_length, bos_id, eos_id, max_length, beam_width) -> token ids [B, <= max_length]."""

    def __init__(self, config: NMTConfig) -> None:
        super().__init__()
        self.config = config
        units = config.units
        self.source_embedding = tf.keras.layers.Embedding(config.source_vocab, units)
        self.target_embedding = tf.keras.layers.Embedding(config.target_vocab, units)
        encoder_layer, decoder_cell = CELLS[config.cells]
        self.encoders = []
        for layer in range(config.layers):
            if layer == 0 and config.bidirectional:
                self.encoders.append(tf.keras.layers.Bidirectional(
                    encoder_layer(units // 2, return_sequences=True, return_state=True)))
            else:
                self.encoders.append(encoder_layer(units, return_sequences=True, return_state=True))
        self.attention = ATTENTIONS[config.attention](units, normalize=config.normalize)
        cells = [decoder_cell(units) for _ in range(config.layers)]
        self.cell = tfa.seq2seq.AttentionWrapper(
            cells[0] if config.layers == 1 else tf.keras.layers.StackedRNNCells(cells), self.attention,
            attention_layer_size=units,
        )
        self.projection = tf.keras.layers.Dense(config.target_vocab)

    def build_variables(self) -> None:
        """Create every weight now (one eager call on a one-token sentence), as the first call would."""
        token = tf.ones([1, 1], tf.int32)
        self(token, tf.ones([1], tf.int32), token)

    def _encode(self, source, source_length):
        """Encoder outputs [B, T, units] and each layer's final [h, c]."""
        mask = tf.sequence_mask(source_length, tf.shape(source)[1])
        outputs, states = self.source_embedding(source), []
        for encoder in self.encoders:
            outputs, *state = encoder(outputs, mask=mask)
            if len(state) == 4:  # bidirectional: forward h, c, backward h, c
                state = [tf.concat([state[0], state[2]], -1), tf.concat([state[1], state[3]], -1)]
            states.append(state)
        return outputs, states

    def _initial_state(self, states, batch, dtype):
        cell_state = states[0] if self.config.layers == 1 else tuple(states)
        return self.cell.get_initial_state(batch_size=batch, dtype=dtype).clone(cell_state=cell_state)

    def call(self, source, source_length, target_in):
        return self._decode(source, source_length, target_in, self.projection)

    def token_losses(self, source, source_length, target_in, target_out):
        """Teacher-forced cross-entropy of each target token [B, T_tgt] (config.loss says how)."""
        if self.config.loss == "keras":
            logits, _ = self(source, source_length, target_in)
            return tf.keras.losses.sparse_categorical_crossentropy(target_out, logits, from_logits=True)
        outputs, _ = self._decode(source, source_length, target_in, None)
        return projected_sparse_cross_entropy(outputs, target_out, self.projection.kernel, self.projection.bias)

    def _decode(self, source, source_length, target_in, output_layer):
        """Teacher-forced decoder outputs (through `output_layer`, if any) and the final alignments."""
        memory, states = self._encode(source, source_length)
        self.attention.setup_memory(memory, memory_sequence_length=source_length)
        batch = tf.shape(source)[0]
        steps = tf.shape(target_in)[1]
        # maximum_iterations bounds the decoder loop by the target length, so the loop's saved
        # activations have a known size (seqmem's analysis reads it from the loop condition)
        decoder = tfa.seq2seq.BasicDecoder(self.cell, tfa.seq2seq.TrainingSampler(), output_layer=output_layer,
                                           maximum_iterations=steps)
        outputs, state, _ = decoder(
            self.target_embedding(target_in), initial_state=self._initial_state(states, batch, memory.dtype),
            sequence_length=tf.fill([batch], steps),
        )
        return outputs.rnn_output, state.alignments

    def translate(self, source, source_length, bos_id: int, eos_id: int, max_length: int, beam_width: int = 1):
        """Greedy (beam_width 1) or beam-search translations: token ids [B, T <= max_length], the best beam's."""
        if beam_width < 1 or max_length < 1:
            raise ValueError(f"beam_width and max_length must be positive, got {beam_width} and {max_length}")
        memory, states = self._encode(source, source_length)
        batch = tf.shape(source)[0]
        start_tokens = tf.fill([batch], bos_id)
        if beam_width == 1:
            self.attention.setup_memory(memory, memory_sequence_length=source_length)
            decoder = tfa.seq2seq.BasicDecoder(
                self.cell, tfa.seq2seq.GreedyEmbeddingSampler(self.target_embedding), output_layer=self.projection,
                maximum_iterations=max_length,
            )
            outputs, _, _ = decoder(None, start_tokens=start_tokens, end_token=eos_id,
                                    initial_state=self._initial_state(states, batch, memory.dtype))
            return outputs.sample_id
        tile = lambda t: tfa.seq2seq.tile_batch(t, beam_width)  # noqa: E731
        self.attention.setup_memory(tile(memory), memory_sequence_length=tile(source_length))
        decoder = tfa.seq2seq.BeamSearchDecoder(
            self.cell, beam_width, output_layer=self.projection, embedding_fn=self.target_embedding,
            maximum_iterations=max_length,
        )
        initial = self._initial_state(tf.nest.map_structure(tile, states), batch * beam_width, memory.dtype)
        outputs, _, _ = decoder(None, start_tokens=start_tokens, end_token=eos_id, initial_state=initial)
        return outputs.predicted_ids[:, :, 0]


def masked_mean(token_losses, target_length):
    """Mean of [B, T] token losses over the first `target_length` positions of each sentence."""
    mask = tf.sequence_mask(target_length, tf.shape(token_losses)[1], dtype=token_losses.dtype)
    return tf.reduce_sum(token_losses * mask) / tf.reduce_sum(mask)


def masked_cross_entropy(target_out, logits, target_length):
    """Mean token cross-entropy over the first `target_length` positions of each sentence."""
    return masked_mean(tf.keras.losses.sparse_categorical_crossentropy(target_out, logits, from_logits=True),
                       target_length)


def make_train_step(model: NMTModel, learning_rate: float = 1e-3):
    """A tf.function (source, source_length, target_in, target_out, target_length) -> loss, updating `model`."""
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    # every variable (weights, Adam's slots) exists before the first trace: created during it, they make
    # tf.function trace the step a second time
    model.build_variables()
    optimizer.build(model.trainable_variables)

    # no tensor-dependent Python control flow here: autograph would only convert tfa's and Keras' code
    # (3/4 of the trace time, measured: 7.7 s -> 2.3 s), and the graph is the same without it
    @tf.function(autograph=False)
    def train_step(source, source_length, target_in, target_out, target_length):
        with tf.GradientTape() as tape:
            loss = masked_mean(model.token_losses(source, source_length, target_in, target_out), target_length)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step
