"""Small built-in training steps: an MLP, a CNN, a small ResNet and an LSTM seq2seq.

The demo, the simulator-accuracy table and the tests profile these. Each is a
custom TF2 training loop step (`tf.GradientTape` + SGD with momentum) wrapped in
`tf.function`, built fresh by `build_example(name, batch)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from seqmem.runtime.device import on_device

__all__ = ["EXAMPLES", "TrainingStep", "build_example"]


@dataclass(frozen=True)
class TrainingStep:
    """A model's training step, the specs of its inputs and a maker of inputs.

    step: tf.function(inputs, labels) -> scalar loss, updating the model's variables.
    make_inputs(seed): concrete tensors matching `input_specs`.
    """

    name: str
    model: tf.keras.Model
    step: Any
    input_specs: tuple[tf.TensorSpec, ...]
    make_inputs: Callable[[int], tuple[tf.Tensor, ...]]


def _train_step(model: tf.keras.Model, loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]):
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)  # slots now, or the step's first call traces it twice

    @tf.function(autograph=False)  # plain TensorFlow: nothing to convert, the same graph
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step


def _sparse_xent(labels, logits):
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _images_and_labels(shape, classes):
    def make(seed: int):
        rng = np.random.default_rng(seed)
        images = on_device(rng.standard_normal(shape).astype(np.float32))
        labels = on_device(rng.integers(0, classes, size=shape[:1]).astype(np.int32))
        return images, labels

    return make


def mlp(batch: int) -> TrainingStep:
    """784 -> 3 x 1024 ReLU -> 10, on random 'images'."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input([784])]
        + [tf.keras.layers.Dense(1024, activation="relu") for _ in range(3)]
        + [tf.keras.layers.Dense(10)]
    )
    specs = (tf.TensorSpec([batch, 784], tf.float32), tf.TensorSpec([batch], tf.int32))
    return TrainingStep("mlp", model, _train_step(model, _sparse_xent), specs, _images_and_labels((batch, 784), 10))


def cnn(batch: int) -> TrainingStep:
    """Four 3x3 conv + batch-norm + ReLU layers with pooling, on 32x32x3 images."""
    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.Input([32, 32, 3])]
    for filters in (32, 64, 64, 128):
        layers += [
            tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
            tf.keras.layers.BatchNormalization(),
            tf.keras.layers.ReLU(),
        ]
        if filters != 32:
            layers.append(tf.keras.layers.MaxPool2D())
    layers += [tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)]
    model = tf.keras.Sequential(layers)
    specs = (tf.TensorSpec([batch, 32, 32, 3], tf.float32), tf.TensorSpec([batch], tf.int32))
    return TrainingStep("cnn", model, _train_step(model, _sparse_xent), specs, _images_and_labels((batch, 32, 32, 3), 10))


def small_resnet(batch: int) -> TrainingStep:
    """A ResNet-14 of basic blocks (3 stages x 2 blocks, 16/32/64 filters) on 32x32x3 images."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input([32, 32, 3])
    x = _conv_bn(inputs, 16, 1, relu=True)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x if stride == 1 and x.shape[-1] == filters else _conv_bn(x, filters, stride, relu=False, kernel=1)
            y = _conv_bn(x, filters, stride, relu=True)
            y = _conv_bn(y, filters, 1, relu=False)
            x = tf.keras.layers.ReLU()(tf.keras.layers.Add()([shortcut, y]))
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
    specs = (tf.TensorSpec([batch, 32, 32, 3], tf.float32), tf.TensorSpec([batch], tf.int32))
    return TrainingStep(
        "resnet", model, _train_step(model, _sparse_xent), specs, _images_and_labels((batch, 32, 32, 3), 10)
    )


def _conv_bn(x, filters, stride, relu, kernel=3):
    x = tf.keras.layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(x)
    x = tf.keras.layers.BatchNormalization()(x)
    return tf.keras.layers.ReLU()(x) if relu else x


def lstm_seq2seq(batch: int, time_steps: int = 30, vocab: int = 1000, units: int = 256) -> TrainingStep:
    """Embedding + LSTM encoder + LSTM decoder (teacher forcing) + softmax over `vocab`."""
    tf.keras.utils.set_random_seed(0)
    source = tf.keras.Input([time_steps], dtype=tf.int32)
    target_in = tf.keras.Input([time_steps], dtype=tf.int32)
    _, state_h, state_c = tf.keras.layers.LSTM(units, return_state=True)(tf.keras.layers.Embedding(vocab, units)(source))
    decoded = tf.keras.layers.LSTM(units, return_sequences=True)(
        tf.keras.layers.Embedding(vocab, units)(target_in), initial_state=[state_h, state_c]
    )
    model = tf.keras.Model([source, target_in], tf.keras.layers.Dense(vocab)(decoded))
    token_spec = tf.TensorSpec([batch, time_steps], tf.int32)

    def make(seed: int):
        rng = np.random.default_rng(seed)
        tokens = lambda: on_device(rng.integers(0, vocab, size=(batch, time_steps)).astype(np.int32))  # noqa: E731
        return (tokens(), tokens()), tokens()

    return TrainingStep("lstm", model, _train_step(model, _sparse_xent), ((token_spec, token_spec), token_spec), make)


EXAMPLES: dict[str, Callable[[int], TrainingStep]] = {
    "mlp": mlp,
    "cnn": cnn,
    "resnet": small_resnet,
    "lstm": lstm_seq2seq,
}


def build_example(name: str, batch: int) -> TrainingStep:
    """The built-in training step `name` (one of EXAMPLES) at batch size `batch`."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}; choose one of {sorted(EXAMPLES)}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    return EXAMPLES[name](batch)
