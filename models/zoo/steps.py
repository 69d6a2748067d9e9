"""The zoo's training steps: models the project did not write, built from what its dependencies ship.

Each builder takes the batch size and returns a `ZooStep`: a tf.function
training step that returns the loss it differentiates (under a mixed-precision
`LossScaleOptimizer`, the unscaled loss; a GAN's two losses summed), the step's
arguments, and every variable a call may change. Builders seed Keras (`set_random_seed(0)`) and
draw their inputs from a seeded generator, so two processes that build the
same step at the same batch start from the same weights and inputs. Optimizer
slots are created before the step is traced, as a training loop's first
`fit` would leave them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from seqmem.runtime.device import on_device

__all__ = ["STEPS", "ZooModel", "ZooStep", "loss_scaled_training"]


@dataclass(frozen=True)
class ZooStep:
    """step: a tf.function called as `step(*inputs)`, returning its loss; variables: all it changes."""

    step: Any
    inputs: tuple
    variables: tuple


def _tape_step(model: tf.keras.Model, optimizer: Any, loss_of: Callable[..., tf.Tensor]) -> Any:
    """The usual custom step: forward under a GradientTape, gradients of every trainable variable, one update."""
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(*batch):
        with tf.GradientTape() as tape:
            loss = loss_of(model, *batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def _built(model: tf.keras.Model, optimizer: Any, step: Any, *inputs: np.ndarray) -> ZooStep:
    return ZooStep(step, tuple(on_device(value) for value in inputs), tuple(model.variables) + tuple(optimizer.variables))


def _classification_loss(model, images, labels):
    logits = model(images, training=True)
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _images(batch: int, size: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal([batch, size, size, 3]).astype(np.float32),
            rng.integers(0, classes, [batch]).astype(np.int32))


def _keras_application(application: Callable[..., tf.keras.Model], size: int) -> Callable[[int], ZooStep]:
    """A `tf.keras.applications` network at `size` x `size`, 10 classes, no pretrained weights, trained with
    SGD with momentum."""

    def build(batch: int) -> ZooStep:
        tf.keras.utils.set_random_seed(0)
        model = application(input_shape=(size, size, 3), weights=None, classes=10, classifier_activation=None)
        optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        return _built(model, optimizer, _tape_step(model, optimizer, _classification_loss), *_images(batch, size, 10))

    return build


def loss_scaled_training(build_model: Callable[[], tf.keras.Model],
                         initial_scale: float = 2.0 ** 15) -> tuple[tf.keras.Model, Any, Any]:
    """A model built by `build_model` under the `mixed_float16` policy, SGD with momentum inside a dynamic
    `LossScaleOptimizer` starting at `initial_scale` (Keras' default 2^15), and its step (`step(inputs,
    labels)`, returning the loss): the scaled loss differentiated, gradients unscaled and checked finite (a
    `tf.cond`) before the update; a call whose gradients overflow skips the update and halves the scale."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.01, momentum=0.9),
                                                            initial_scale=initial_scale)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = _classification_loss(model, inputs, labels)
            scaled = optimizer.get_scaled_loss(loss)
        gradients = optimizer.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return model, optimizer, step


def mixed_precision_resnet50(batch: int) -> ZooStep:
    """ResNet50 at 32 x 32 in `loss_scaled_training`, its loss scale starting at 2^8: from Keras' 2^15 the
    gradients of its first 7 calls overflow and the scale halves to 2^8 before an update applies, so compared
    calls from 2^15 would test the skipped update only."""
    tf.keras.utils.set_random_seed(0)
    model, optimizer, step = loss_scaled_training(lambda: tf.keras.applications.ResNet50(
        input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None), initial_scale=2.0 ** 8)
    return _built(model, optimizer, step, *_images(batch, 32, 10))


def clipped_conditional_cnn(batch: int) -> ZooStep:
    """A custom loop's step: a plain Conv-BN-ReLU network, gradients clipped by their global norm, and a
    `tf.cond` that applies the update only when the loss is finite (Adam)."""
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    inputs = tf.keras.Input([32, 32, 3])
    x = inputs
    for filters in (32, 32, 64, 64, 128):
        x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)))
        if filters in (32, 64):
            x = layers.MaxPooling2D()(x) if x.shape[1] > 8 else x
    model = tf.keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)))
    optimizer = tf.keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = _classification_loss(model, images, labels)
        gradients, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 1.0)

        def update():
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return tf.constant(True)

        tf.cond(tf.math.is_finite(loss), update, lambda: tf.constant(False))
        return loss

    return _built(model, optimizer, step, *_images(batch, 32, 10))


# sequences: T tokens, a vocabulary of VOCAB, UNITS wide
T, VOCAB, UNITS = 32, 1000, 128


def _tokens(batch: int, *lengths: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(1, VOCAB, [batch, length]).astype(np.int32) for length in lengths]


def _sequence_loss(model, *batch):
    *inputs, targets = batch
    logits = model(*inputs, training=True)
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))


class _Seq2seq(tf.keras.Model):
    """A Keras LSTM encoder and a tfa `AttentionWrapper` decoder (`BasicDecoder`, teacher forcing)."""

    def __init__(self, attention: Callable[[int], Any], batch: int) -> None:
        super().__init__()
        self.batch = batch
        self.embed = tf.keras.layers.Embedding(VOCAB, UNITS)
        self.encoder = tf.keras.layers.LSTM(UNITS, return_sequences=True, return_state=True)
        self.attention = attention(UNITS)
        self.cell = _tfa_seq2seq().AttentionWrapper(tf.keras.layers.LSTMCell(UNITS), self.attention,
                                                   attention_layer_size=UNITS)
        self.decoder = _tfa_seq2seq().BasicDecoder(self.cell, _tfa_seq2seq().TrainingSampler(),
                                                  output_layer=tf.keras.layers.Dense(VOCAB))

    def call(self, source, target_in, training=None):
        memory, h, c = self.encoder(self.embed(source))
        self.attention.setup_memory(memory)
        start = self.cell.get_initial_state(batch_size=self.batch, dtype=tf.float32).clone(cell_state=[h, c])
        outputs, _, _ = self.decoder(self.embed(target_in), initial_state=start,
                                     sequence_length=tf.fill([self.batch], tf.shape(target_in)[1]))
        return outputs.rnn_output


def _tfa_seq2seq():
    import tensorflow_addons as tfa

    return tfa.seq2seq


def _tfa_attention(name: str) -> Callable[[int], ZooStep]:
    def build(batch: int) -> ZooStep:
        tf.keras.utils.set_random_seed(0)
        model = _Seq2seq(getattr(_tfa_seq2seq(), name), batch)
        tokens = _tokens(batch, T, T, T)
        model(*tokens[:2])  # a subclassed model makes its variables on its first call
        optimizer = tf.keras.optimizers.Adam(1e-3)
        return _built(model, optimizer, _tape_step(model, optimizer, _sequence_loss), *tokens)

    return build


class _Positions(tf.keras.layers.Layer):
    """Adds a learned embedding of each position to [batch, T, UNITS] inputs."""

    def build(self, input_shape):
        self.table = self.add_weight(name="positions", shape=input_shape[1:], initializer="random_normal")

    def call(self, x):
        return x + self.table


def _embedded(tokens):
    return _Positions()(tf.keras.layers.Embedding(VOCAB, UNITS)(tokens))


def _padding_mask(tokens):
    """[batch, 1, T]: True where a token is not padding (0); broadcast over queries by MultiHeadAttention."""
    return tf.keras.layers.Lambda(lambda t: tf.not_equal(t, 0)[:, None, :])(tokens)


def _transformer_block(x, mask, context=None, context_mask=None, causal=False, dropout=0.1, heads=4):
    """A post-norm Transformer block of Keras layers: self-attention (causal where asked) over the keys
    `mask` keeps, cross-attention on `context` where given, a feed-forward layer; dropout after each."""
    layers = tf.keras.layers
    attended = layers.MultiHeadAttention(heads, UNITS // heads, dropout=dropout)(
        x, x, attention_mask=mask, use_causal_mask=causal)
    x = layers.LayerNormalization()(x + layers.Dropout(dropout)(attended))
    if context is not None:
        attended = layers.MultiHeadAttention(heads, UNITS // heads, dropout=dropout)(
            x, context, attention_mask=context_mask)
        x = layers.LayerNormalization()(x + layers.Dropout(dropout)(attended))
    hidden = layers.Dense(UNITS)(layers.Dense(4 * UNITS, activation="relu")(x))
    return layers.LayerNormalization()(x + layers.Dropout(dropout)(hidden))


def _padded_tokens(batch: int, *arrays: np.ndarray) -> list[np.ndarray]:
    """`arrays` with each row's tail past a random length (T/2 to T) set to 0, the padding token."""
    lengths = np.random.default_rng(2).integers(T // 2, T + 1, [batch])
    keep = np.arange(T)[None, :] < lengths[:, None]
    return [np.where(keep, array, 0).astype(np.int32) for array in arrays]


def transformer_encoder_decoder(batch: int) -> ZooStep:
    """Two encoder and two decoder blocks of Keras `MultiHeadAttention` (dropout 0.1, padding masks, a
    causal decoder), Adam; padded targets weigh nothing in the loss."""
    tf.keras.utils.set_random_seed(0)
    source, target_in = tf.keras.Input([T], dtype=tf.int32), tf.keras.Input([T], dtype=tf.int32)
    source_mask, target_mask = _padding_mask(source), _padding_mask(target_in)
    memory = _embedded(source)
    for _ in range(2):
        memory = _transformer_block(memory, source_mask)
    x = _embedded(target_in)
    for _ in range(2):
        x = _transformer_block(x, target_mask, context=memory, context_mask=source_mask, causal=True)
    model = tf.keras.Model([source, target_in], tf.keras.layers.Dense(VOCAB)(x))
    optimizer = tf.keras.optimizers.Adam(1e-3)

    def loss_of(model, source, target_in, target_out):
        logits = model([source, target_in], training=True)
        losses = tf.keras.losses.sparse_categorical_crossentropy(target_out, logits, from_logits=True)
        weights = tf.cast(tf.not_equal(target_out, 0), losses.dtype)
        return tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)

    return _built(model, optimizer, _tape_step(model, optimizer, loss_of), *_padded_tokens(batch, *_tokens(batch, T, T, T)))


def transformer_lm(batch: int) -> ZooStep:
    """A decoder-only Transformer language model: three causal blocks of Keras `MultiHeadAttention`,
    dropout 0.1, Adam."""
    tf.keras.utils.set_random_seed(0)
    tokens = tf.keras.Input([T], dtype=tf.int32)
    x, mask = _embedded(tokens), _padding_mask(tokens)
    for _ in range(3):
        x = _transformer_block(x, mask, causal=True)
    model = tf.keras.Model(tokens, tf.keras.layers.Dense(VOCAB)(x))
    optimizer = tf.keras.optimizers.Adam(1e-3)
    return _built(model, optimizer, _tape_step(model, optimizer, _sequence_loss), *_tokens(batch, T, T))


def bidirectional_gru_classifier(batch: int) -> ZooStep:
    """Embedding, a bidirectional GRU over the sequence, a second GRU, a classifier over 5 classes (Adam)."""
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    model = tf.keras.Sequential([tf.keras.Input([T], dtype=tf.int32), layers.Embedding(VOCAB, UNITS),
                                 layers.Bidirectional(layers.GRU(UNITS, return_sequences=True)),
                                 layers.GRU(UNITS), layers.Dense(5)])
    optimizer = tf.keras.optimizers.Adam(1e-3)
    (tokens,) = _tokens(batch, T)
    labels = np.random.default_rng(1).integers(0, 5, [batch]).astype(np.int32)
    return _built(model, optimizer, _tape_step(model, optimizer, _classification_loss), tokens, labels)


def stacked_lstm_lm(batch: int) -> ZooStep:
    """Embedding, two stacked LSTMs returning sequences, a softmax over the vocabulary (SGD)."""
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    model = tf.keras.Sequential([tf.keras.Input([T], dtype=tf.int32), layers.Embedding(VOCAB, UNITS),
                                 layers.LSTM(UNITS, return_sequences=True),
                                 layers.LSTM(UNITS, return_sequences=True), layers.Dense(VOCAB)])
    optimizer = tf.keras.optimizers.SGD(0.5)
    return _built(model, optimizer, _tape_step(model, optimizer, _sequence_loss), *_tokens(batch, T, T))


def recommender(batch: int) -> ZooStep:
    """Wide-and-deep click model: eight categorical features, each embedded from a table of 20,000 rows,
    concatenated with 16 dense features into a 3-layer MLP (1024-512-256) and a linear wide part; binary
    cross-entropy, Adagrad (sparse updates of the tables)."""
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    categorical, dense = tf.keras.Input([8], dtype=tf.int32), tf.keras.Input([16])
    embedded = [layers.Flatten()(layers.Embedding(20000, 32)(categorical[:, i:i + 1])) for i in range(8)]
    x = layers.Concatenate()(embedded + [dense])
    for width in (1024, 512, 256):
        x = layers.Dense(width, activation="relu")(x)
    logit = layers.Dense(1)(x) + layers.Dense(1)(dense)
    model = tf.keras.Model([categorical, dense], logit)
    optimizer = tf.keras.optimizers.Adagrad(0.05)

    def loss_of(model, categorical, dense, clicks):
        logits = model([categorical, dense], training=True)
        return tf.reduce_mean(tf.keras.losses.binary_crossentropy(clicks, logits, from_logits=True))

    rng = np.random.default_rng(0)
    inputs = (rng.integers(0, 20000, [batch, 8]).astype(np.int32), rng.standard_normal([batch, 16]).astype(np.float32),
              rng.integers(0, 2, [batch, 1]).astype(np.float32))
    return _built(model, optimizer, _tape_step(model, optimizer, loss_of), *inputs)


def unet_segmentation(batch: int) -> ZooStep:
    """A U-Net on 64 x 64 images: three levels of two convolutions (batch norm on the second), max pooling
    down, `Conv2DTranspose` up, each level's features concatenated back; per-pixel sparse cross-entropy over
    5 classes (Adam)."""
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    images = tf.keras.Input([64, 64, 3])
    x, skips = images, []
    for filters in (16, 32, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same", activation="relu")(x))
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(128, 3, padding="same", activation="relu")(x)
    for filters, skip in zip((64, 32, 16), reversed(skips)):
        x = layers.Concatenate()([layers.Conv2DTranspose(filters, 2, strides=2)(x), skip])
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    model = tf.keras.Model(images, layers.Conv2D(5, 1)(x))
    optimizer = tf.keras.optimizers.Adam(1e-3)
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal([batch, 64, 64, 3]).astype(np.float32),
              rng.integers(0, 5, [batch, 64, 64]).astype(np.int32))
    return _built(model, optimizer, _tape_step(model, optimizer, _classification_loss), *inputs)


def multitask_mobilenet(batch: int) -> ZooStep:
    """A MobileNetV2 trunk (32 x 32) with two heads, 10 classes and a 4-number box, L2-regularized; the loss
    is the sum of a sparse cross-entropy, a mean squared error and the regularization terms (SGD with
    momentum)."""
    tf.keras.utils.set_random_seed(0)
    layers, l2 = tf.keras.layers, tf.keras.regularizers.L2(1e-4)
    trunk = tf.keras.applications.MobileNetV2(input_shape=(32, 32, 3), include_top=False, weights=None)
    features = layers.GlobalAveragePooling2D()(trunk.output)
    model = tf.keras.Model(trunk.input, [layers.Dense(10, kernel_regularizer=l2)(features),
                                         layers.Dense(4, kernel_regularizer=l2)(features)])
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    cross_entropy = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    squared_error = tf.keras.losses.MeanSquaredError()

    def loss_of(model, images, labels, boxes):
        classes, box = model(images, training=True)
        return cross_entropy(labels, classes) + squared_error(boxes, box) + tf.add_n(model.losses)

    images, labels = _images(batch, 32, 10)
    boxes = np.random.default_rng(1).random([batch, 4]).astype(np.float32)
    return _built(model, optimizer, _tape_step(model, optimizer, loss_of), images, labels, boxes)


def dcgan(batch: int) -> ZooStep:
    """TensorFlow's DCGAN tutorial step on 28 x 28 images: a generator of `Conv2DTranspose` + batch norm from
    100 normal noise numbers (`tf.random.normal` in the step), a discriminator of strided convolutions with
    dropout 0.3; each loss differentiated by its own tape, each network updated by its own Adam; the step
    returns the two losses summed."""
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers

    def upsampling(filters, strides):
        return [layers.Conv2DTranspose(filters, 5, strides, padding="same", use_bias=False),
                layers.BatchNormalization(), layers.LeakyReLU()]

    generator = tf.keras.Sequential(
        [tf.keras.Input([100]), layers.Dense(7 * 7 * 128, use_bias=False), layers.BatchNormalization(),
         layers.LeakyReLU(), layers.Reshape((7, 7, 128))] + upsampling(64, 1) + upsampling(32, 2)
        + [layers.Conv2DTranspose(1, 5, 2, padding="same", activation="tanh")])
    discriminator = tf.keras.Sequential(
        [tf.keras.Input([28, 28, 1]), layers.Conv2D(64, 5, 2, padding="same"), layers.LeakyReLU(),
         layers.Dropout(0.3), layers.Conv2D(128, 5, 2, padding="same"), layers.LeakyReLU(), layers.Dropout(0.3),
         layers.Flatten(), layers.Dense(1)])
    cross_entropy = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    optimizers = tf.keras.optimizers.Adam(1e-4), tf.keras.optimizers.Adam(1e-4)
    networks = generator, discriminator
    for optimizer, network in zip(optimizers, networks):
        optimizer.build(network.trainable_variables)

    @tf.function
    def step(images):
        noise = tf.random.normal([batch, 100])
        with tf.GradientTape() as generator_tape, tf.GradientTape() as discriminator_tape:
            real, fake = discriminator(images, training=True), discriminator(generator(noise, training=True),
                                                                             training=True)
            generator_loss = cross_entropy(tf.ones_like(fake), fake)
            discriminator_loss = cross_entropy(tf.ones_like(real), real) + cross_entropy(tf.zeros_like(fake), fake)
        for tape, loss, optimizer, network in zip((generator_tape, discriminator_tape),
                                                  (generator_loss, discriminator_loss), optimizers, networks):
            variables = network.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return generator_loss + discriminator_loss

    images = np.random.default_rng(0).standard_normal([batch, 28, 28, 1]).astype(np.float32)
    variables = tuple(v for network in networks for v in network.variables)
    return ZooStep(step, (on_device(images),), variables + tuple(v for o in optimizers for v in o.variables))


@dataclass(frozen=True)
class ZooModel:
    """family: what kind of model; build: batch -> ZooStep; batch: where its feature maps outweigh any one
    kernel's scratch (TensorFlow's CPU convolution gradients take up to 30 MiB) and its weights and slots
    (the mixed-precision ResNet50 short of that, for its step time on CPU); quick_batch: the batch of the
    quick subset (None: not in it)."""

    family: str
    build: Callable[[int], ZooStep]
    batch: int
    quick_batch: Optional[int] = None


_apps = tf.keras.applications
_CNN = "CNN (Keras applications)"
_TRANSFORMER = "Transformer (Keras MultiHeadAttention)"
_SEQ2SEQ = "attention seq2seq (tfa)"
_RECURRENT = "recurrent (Keras)"

STEPS: dict[str, ZooModel] = {
    "mobilenet_v2": ZooModel(_CNN, _keras_application(_apps.MobileNetV2, 32), 64),
    "resnet50": ZooModel(_CNN, _keras_application(_apps.ResNet50, 32), 96),
    "densenet121": ZooModel(_CNN, _keras_application(_apps.DenseNet121, 32), 32),
    "efficientnet_b0": ZooModel(_CNN, _keras_application(_apps.EfficientNetB0, 32), 32),
    "inception_v3": ZooModel(_CNN, _keras_application(_apps.InceptionV3, 75), 48),
    "xception": ZooModel(_CNN, _keras_application(_apps.Xception, 71), 16),
    "mobilenet_v3_small": ZooModel(_CNN, _keras_application(_apps.MobileNetV3Small, 64), 64),
    "regnetx002": ZooModel(_CNN, _keras_application(_apps.RegNetX002, 64), 64),
    "efficientnet_v2_b0": ZooModel(_CNN, _keras_application(_apps.EfficientNetV2B0, 64), 32),
    "nasnet_mobile": ZooModel(_CNN, _keras_application(_apps.NASNetMobile, 64), 32),
    "resnet50_mixed_precision": ZooModel("mixed precision", mixed_precision_resnet50, 64),
    "cnn_clipped_cond": ZooModel("custom loop (clipping, tf.cond)", clipped_conditional_cnn, 256),
    "tfa_bahdanau": ZooModel(_SEQ2SEQ, _tfa_attention("BahdanauAttention"), 32, quick_batch=16),
    "tfa_luong": ZooModel(_SEQ2SEQ, _tfa_attention("LuongAttention"), 32),
    "transformer_encoder_decoder": ZooModel(_TRANSFORMER, transformer_encoder_decoder, 32),
    "transformer_lm": ZooModel(_TRANSFORMER, transformer_lm, 32, quick_batch=16),
    "bidirectional_gru": ZooModel(_RECURRENT, bidirectional_gru_classifier, 64),
    "stacked_lstm_lm": ZooModel(_RECURRENT, stacked_lstm_lm, 64),
    "recommender": ZooModel("embeddings (wide and deep)", recommender, 4096),
    "unet": ZooModel("segmentation (U-Net)", unet_segmentation, 32),
    "multitask_mobilenet": ZooModel("multi-task (summed losses, L2)", multitask_mobilenet, 64),
    "dcgan": ZooModel("GAN (two tapes)", dcgan, 256),
}
