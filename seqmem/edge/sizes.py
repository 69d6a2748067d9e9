"""Bytes a tensor of known dtype and static shape occupies on the device."""

from __future__ import annotations

import math

import tensorflow as tf

__all__ = ["static_bytes"]


def static_bytes(dtype: tf.DType, shape) -> int | None:
    """Element count x `dtype`'s size, in bytes; None when `shape` is not fully defined or the dtype has no
    fixed size (strings, variants, resource handles)."""
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined() or dtype in (tf.string, tf.variant, tf.resource):
        return None
    return math.prod(shape.as_list()) * dtype.size
