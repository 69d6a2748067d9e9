"""Pre-activation bottleneck ResNets ("identity mappings", He et al. 2016) for small images.

Depth 9n + 2: three stages of n bottleneck blocks (16/32/64 bottleneck filters,
4x expansion), e.g. ResNet-164 (n = 18) and ResNet-1001 (n = 111).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["preact_resnet"]


def _block(x, filters: int, stride: int, project: bool):
    shortcut = x
    x = tf.keras.layers.BatchNormalization()(x)
    x = tf.keras.layers.ReLU()(x)
    if project:
        shortcut = tf.keras.layers.Conv2D(4 * filters, 1, strides=stride, use_bias=False)(x)
    for kernel, out, step in ((1, filters, 1), (3, filters, stride), (1, 4 * filters, 1)):
        if kernel != 1 or out != filters:
            x = tf.keras.layers.BatchNormalization()(x)
            x = tf.keras.layers.ReLU()(x)
        x = tf.keras.layers.Conv2D(out, kernel, strides=step, padding="same", use_bias=False)(x)
    return tf.keras.layers.Add()([shortcut, x])


def preact_resnet(depth: int, image_size: int = 32, classes: int = 10) -> tf.keras.Model:
    """A pre-activation bottleneck ResNet of `depth` = 9n + 2 layers."""
    if depth < 11 or (depth - 2) % 9:
        raise ValueError(f"depth must be 9n + 2 with n >= 1 (e.g. 164, 1001), got {depth}")
    blocks = (depth - 2) // 9
    inputs = tf.keras.Input([image_size, image_size, 3])
    x = tf.keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _block(x, filters, stride, project=block == 0)
    x = tf.keras.layers.ReLU()(tf.keras.layers.BatchNormalization()(x))
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(classes)(x))
