"""Keras training steps for the tests that trace or optimize a real step (TensorFlow imported when called)."""


def classifier_step(model, optimizer):
    """A tf.function `step(x, y) -> loss`: the mean sparse cross-entropy of `model`'s logits against integer
    labels `y`, its gradient applied by `optimizer`."""
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step
