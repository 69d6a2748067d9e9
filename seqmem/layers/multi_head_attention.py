"""`MemoryEfficientMultiHeadAttention`: Keras' `MultiHeadAttention` with blocked attention.

A drop-in for `tf.keras.layers.MultiHeadAttention` (Keras 2.15): the same constructor, variables (names,
shapes, order), config and call contract, so a checkpoint or weights written with one load into the other.
It projects queries, keys and values and the output with Keras' own sublayers, and computes the attention
between them with `blocked_attention` (`seqmem.layers.blocked_attention`): blocks of queries and keys, an
online softmax, and probabilities recomputed in backward, so training keeps no [B, heads, T, S] tensor.

Masks are Keras' (`attention_mask`, the inputs' Keras masks, `use_causal_mask`), combined one block at a
time instead of into a [B, T, S] tensor. Dropout (`dropout=`, in training) drops probabilities as Keras'
does, from a seed drawn once per call by a stateful op (it follows `tf.random.set_seed`, as Keras' `Dropout`
does); the masks differ from Keras' own, the distribution does not.

Keras' own computation runs instead (and holds what Keras holds) where blocks cannot serve: with
`return_attention_scores=True` (the [B, heads, T, S] scores are the result asked for), with
`attention_axes` other than the sequence axis of [B, T, dim] inputs, and with ragged inputs.
"""

from __future__ import annotations

import math
from typing import Optional

import tensorflow as tf

from seqmem.layers.blocked_attention import AttentionMask, blocked_attention

__all__ = ["MemoryEfficientMultiHeadAttention"]


@tf.keras.utils.register_keras_serializable(package="seqmem")
class MemoryEfficientMultiHeadAttention(tf.keras.layers.MultiHeadAttention):
    """`tf.keras.layers.MultiHeadAttention` computing attention in blocks (module docstring).

    query_block_size, key_block_size: positions of queries and of keys per block (each block's scores are
    [B, heads, query_block_size, key_block_size]); None: chosen for each call's batch and heads
    (`seqmem.layers.blocked_attention.default_block`). Every other argument is Keras'. Raises ValueError
    for a block size below 1.
    """

    def __init__(self, *args, query_block_size: Optional[int] = None, key_block_size: Optional[int] = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        for name, size in (("query_block_size", query_block_size), ("key_block_size", key_block_size)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                raise ValueError(f"{name} must be a positive int or None, got {size!r}")
        self._query_block_size = query_block_size
        self._key_block_size = key_block_size

    def get_config(self):
        return {**super().get_config(), "query_block_size": self._query_block_size,
                "key_block_size": self._key_block_size}

    def call(self, query, value, key=None, attention_mask=None, return_attention_scores=False, training=None,
             use_causal_mask=False):
        if not self._built_from_signature:
            self._build_from_signature(query=query, value=value, key=key)
        ragged = any(isinstance(t, tf.RaggedTensor) for t in (query, value, key))
        if return_attention_scores or ragged or len(query.shape) != 3 or self._attention_axes != (1,):
            return super().call(query, value, key=key, attention_mask=attention_mask,
                                return_attention_scores=return_attention_scores, training=training,
                                use_causal_mask=use_causal_mask)
        key = value if key is None else key
        mask = _keras_masks(query, value, key, attention_mask, use_causal_mask)
        # Keras scales the projected query before the product (`_compute_attention`): the same op here.
        projected_query = tf.multiply(self._query_dense(query), 1.0 / math.sqrt(float(self._key_dim)))
        rate = self._dropout if self._dropout > 0.0 and _training(training) else 0.0
        seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32) if rate > 0.0 else None
        attention = blocked_attention(projected_query, self._key_dense(key), self._value_dense(value), mask,
                                      dropout_rate=rate, seed=seed, query_block=self._query_block_size,
                                      key_block=self._key_block_size)
        return self._output_dense(attention)


def _keras_masks(query, value, key, attention_mask, use_causal_mask: bool) -> AttentionMask:
    """The masks Keras' `_compute_attention_mask` combines, as factors: the query's and the keys' Keras
    masks (`_keras_mask`; the key's is the value's where key is value), the explicit mask, the causal one."""
    keys = _bool(getattr(value, "_keras_mask", None))
    key_mask = _bool(getattr(key, "_keras_mask", None)) if key is not value else None
    if key_mask is not None:
        keys = key_mask if keys is None else tf.logical_and(keys, key_mask)
    return AttentionMask(queries=_bool(getattr(query, "_keras_mask", None)), keys=keys,
                         pairs=_bool(attention_mask), causal=bool(use_causal_mask))


def _bool(mask):
    return None if mask is None else tf.cast(mask, tf.bool)


def _training(training) -> bool:
    """Whether the call trains (drops out), resolved as Keras' `Dropout` resolves it; raises ValueError where
    it is a tensor without a value when the layer is traced."""
    if training is None:
        training = tf.keras.backend.learning_phase()
    value = tf.get_static_value(training)
    if value is None:
        raise ValueError("MemoryEfficientMultiHeadAttention needs `training` known when it is traced: "
                         "pass training=True or False")
    return bool(value)
