"""The word-level LSTM language model after TF-LM: embedding, stacked LSTM layers, a softmax over the words.

Trained as TF-LM trains it, SGD with gradients clipped to a global norm (or Adam, clipped the same way). The
benchmark (`models.lm.benchmark`) and the training run (`models.lm.train`)
both build it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CELLS", "LOSSES", "OPTIMIZERS", "LanguageModel", "language_model"]

CELLS = ("keras", "efficient")
LOSSES = ("keras", "efficient")
OPTIMIZERS = ("sgd", "adam")


@dataclass
class LanguageModel:
    """Layers and optimizer of one language model; every variable exists (built before any trace).

    body: the embedding and the LSTM layers, [batch, steps] word ids -> [batch, steps, units] features.
    projection: the `Dense` layer whose logits are the next word's scores.
    loss: "keras" (the projection's logits, then Keras' cross-entropy) or "efficient" (the same weights, block
    by block: `seqmem.projected_mean_cross_entropy` in training, `seqmem.projected_sparse_cross_entropy` to
    evaluate).
    """

    body: Any  # tf.keras.Sequential
    projection: Any  # tf.keras.layers.Dense
    optimizer: Any  # tf.keras.optimizers.Optimizer
    loss: str
    clip_norm: float

    @property
    def variables(self) -> list[Any]:
        return self.body.trainable_variables + self.projection.trainable_variables

    def token_losses(self, inputs: Any, targets: Any, training: bool) -> Any:
        """[batch, steps] cross-entropy (nats) of each target word given the words before it."""
        import tensorflow as tf

        from seqmem.layers.softmax_loss import projected_sparse_cross_entropy

        features = self.body(inputs, training=training)
        if self.loss == "efficient":
            return projected_sparse_cross_entropy(features, targets, self.projection.kernel, self.projection.bias)
        return tf.keras.losses.sparse_categorical_crossentropy(targets, self.projection(features), from_logits=True)

    def _mean_loss(self, inputs: Any, targets: Any) -> Any:
        """Mean cross-entropy (nats) over the batch's target words, in training."""
        import tensorflow as tf

        from seqmem.layers.softmax_loss import projected_mean_cross_entropy

        if self.loss == "efficient":
            features = self.body(inputs, training=True)
            return projected_mean_cross_entropy(features, targets, self.projection.kernel, self.projection.bias)
        return tf.reduce_mean(self.token_losses(inputs, targets, training=True))

    def train_step(self) -> Any:
        """A tf.function (inputs, targets) -> mean loss (nats) that applies one optimizer update."""
        import tensorflow as tf

        variables = self.variables

        @tf.function(autograph=False)
        def step(inputs, targets):
            with tf.GradientTape() as tape:
                mean_loss = self._mean_loss(inputs, targets)
            gradients, _ = tf.clip_by_global_norm(tape.gradient(mean_loss, variables), self.clip_norm)
            self.optimizer.apply_gradients(zip(gradients, variables))
            return mean_loss

        return step


def language_model(layers: int, units: int, vocab: int, cells: str = "keras", loss: str = "keras",
                   optimizer: str = "sgd", learning_rate: float = 1.0, clip_norm: float = 5.0,
                   seed: int = 0) -> LanguageModel:
    """A LanguageModel of `layers` LSTM layers of `units`, over `vocab` words, weights seeded by `seed`.

    cells: "keras" (`tf.keras.layers.LSTM`) or "efficient" (`seqmem.MemoryEfficientLSTM`, the same weights);
    optimizer: "sgd" (TF-LM's) or "adam", at `learning_rate`.
    Raises ValueError for an unknown `cells`, `loss` or `optimizer`.
    """
    import tensorflow as tf

    from seqmem.layers.recurrent import MemoryEfficientLSTM

    if cells not in CELLS or loss not in LOSSES or optimizer not in OPTIMIZERS:
        raise ValueError(f"cells must be one of {CELLS}, loss one of {LOSSES} and optimizer one of "
                         f"{list(OPTIMIZERS)}, got {cells!r}, {loss!r} and {optimizer!r}")
    lstm = tf.keras.layers.LSTM if cells == "keras" else MemoryEfficientLSTM
    tf.keras.utils.set_random_seed(seed)
    body = tf.keras.Sequential([tf.keras.layers.Embedding(vocab, units)]
                               + [lstm(units, return_sequences=True) for _ in range(layers)])
    projection = tf.keras.layers.Dense(vocab)
    # every variable exists before the first trace: created during it, they make tf.function trace twice
    body.build([None, None])
    projection.build([None, units])
    optimizer_class = tf.keras.optimizers.SGD if optimizer == "sgd" else tf.keras.optimizers.Adam
    model = LanguageModel(body, projection, optimizer_class(learning_rate), loss, clip_norm)
    model.optimizer.build(model.variables)
    return model
