"""Bottleneck ResNets in tf.keras: the ImageNet layout (He et al. 2015) and the
pre-activation layout of "Identity Mappings in Deep Residual Networks" (He et al. 2016).

- Depths 50/101/152/200: ImageNet layout, 7x7/2 stem and 3x3/2 max-pool, four
  stages of bottleneck blocks (64/128/256/512 filters, 4x expansion), stride on
  the 3x3 convolution ("v1.5"), post-activation (BN after each convolution).
- Any other depth 9n + 2 (e.g. 164, 1001, 2000): the pre-activation CIFAR layout,
  a 3x3 stem and three stages of n bottleneck blocks (16/32/64 filters).

`depth` counts weight layers on the main path: convolutions plus the classifier;
projection shortcuts (one per stage) are not counted, as in the papers.
`recompute=True` wraps every residual block in `tf.recompute_grad` (gradient
checkpointing): the block's activations are recomputed in backward instead of
stored. Batch-norm moving statistics are then updated once more per step during
recomputation, as with any use of `tf.recompute_grad` around batch norm.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["IMAGENET_STAGES", "ResidualBlock", "resnet"]

IMAGENET_STAGES = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3), 200: (3, 24, 36, 3)}
_CONV = dict(use_bias=False, kernel_initializer="he_normal")


class ResidualBlock(tf.keras.layers.Layer):
    """One bottleneck block: 1x1 (`filters`) -> 3x3 (`filters`, `stride`) -> 1x1 (4 x `filters`) plus shortcut.

    preactivation: BN-ReLU before each convolution (He et al. 2016) instead of BN
    after it and ReLU after the addition (He et al. 2015). The shortcut is a 1x1
    projection when `project` (first block of a stage), else the identity.
    """

    def __init__(self, filters: int, stride: int, project: bool, preactivation: bool, recompute: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.filters, self.stride, self.project = filters, stride, project
        self.preactivation, self.recompute = preactivation, recompute
        shapes = ((1, filters, 1), (3, filters, stride), (1, 4 * filters, 1))
        self.convs = [tf.keras.layers.Conv2D(out, k, strides=s, padding="same", **_CONV)
                      for k, out, s in shapes]
        self.norms = [tf.keras.layers.BatchNormalization() for _ in shapes]
        self.shortcut = (tf.keras.layers.Conv2D(4 * filters, 1, strides=stride, name="shortcut", **_CONV)
                         if project else None)
        self.shortcut_norm = tf.keras.layers.BatchNormalization() if project and not preactivation else None

    def call(self, x, training=None):
        forward = lambda x: self._forward(x, training)  # noqa: E731
        return tf.recompute_grad(forward)(x) if self.recompute else forward(x)

    def _forward(self, x, training):
        if self.preactivation:
            y = tf.nn.relu(self.norms[0](x, training=training))
            shortcut = self.shortcut(y) if self.project else x
            for index, conv in enumerate(self.convs):
                if index:
                    y = tf.nn.relu(self.norms[index](y, training=training))
                y = conv(y)
            return y + shortcut
        shortcut = self.shortcut_norm(self.shortcut(x), training=training) if self.project else x
        y = x
        for index, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            y = norm(conv(y), training=training)
            if index < 2:
                y = tf.nn.relu(y)
        return tf.nn.relu(y + shortcut)

    def get_config(self) -> dict:
        return {**super().get_config(), "filters": self.filters, "stride": self.stride, "project": self.project,
                "preactivation": self.preactivation, "recompute": self.recompute}


def resnet(depth: int, image_size: int = 64, classes: int = 1000, recompute: bool = False) -> tf.keras.Model:
    """A bottleneck ResNet of `depth` weight layers for `image_size` x `image_size` RGB images (logits out).

    Raises ValueError for a depth that is neither 50/101/152/200 nor 9n + 2, or
    for a non-positive image size or class count.
    """
    if image_size < 1 or classes < 1:
        raise ValueError(f"image_size and classes must be positive, got {image_size} and {classes}")
    inputs = tf.keras.Input([image_size, image_size, 3], name="images")
    if depth in IMAGENET_STAGES:
        x = tf.keras.layers.Conv2D(64, 7, strides=2, padding="same", name="stem", **_CONV)(inputs)
        x = tf.nn.relu(tf.keras.layers.BatchNormalization(name="stem_norm")(x))
        x = tf.keras.layers.MaxPool2D(3, strides=2, padding="same")(x)
        stages, widths, preactivation = IMAGENET_STAGES[depth], (64, 128, 256, 512), False
    elif depth >= 11 and (depth - 2) % 9 == 0:
        x = tf.keras.layers.Conv2D(16, 3, padding="same", name="stem", **_CONV)(inputs)
        stages, widths, preactivation = ((depth - 2) // 9,) * 3, (16, 32, 64), True
    else:
        raise ValueError(f"depth must be one of {sorted(IMAGENET_STAGES)} or 9n + 2 (e.g. 164, 1001, 2000), got {depth}")
    for stage, (blocks, filters) in enumerate(zip(stages, widths)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = ResidualBlock(filters, stride, project=block == 0, preactivation=preactivation, recompute=recompute,
                              name=f"stage{stage + 1}_block{block + 1}")(x)
    if preactivation:
        x = tf.nn.relu(tf.keras.layers.BatchNormalization(name="final_norm")(x))
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    logits = tf.keras.layers.Dense(classes, name="logits")(x)
    return tf.keras.Model(inputs, logits, name=f"resnet{depth}")
