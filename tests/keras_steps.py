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


def conditional_update_step(count=4):
    """A tf.function `step(apply) -> (loss, applied)` over `count` [256, 1024] float32 variables (1 MiB each)
    whose gradients, sin(v), SGD with momentum applies in a `tf.cond` on `apply`, as a loss-scale optimizer
    applies them: its concrete function, the variables it changes (the optimizer's slots included) and the
    optimizer (it holds the learning rate's variable: keep it while the function is in use)."""
    import tensorflow as tf

    variables = [tf.Variable(tf.fill([256, 1024], float(i))) for i in range(count)]
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(variables)

    @tf.function(autograph=False)
    def step(apply):
        gradients = [tf.sin(v) for v in variables]

        def update():
            optimizer.apply_gradients(zip(gradients, variables))
            return tf.constant(True)

        loss = tf.add_n([tf.reduce_sum(g) for g in gradients])
        return loss, tf.cond(apply, update, lambda: tf.constant(False))

    return step.get_concrete_function(tf.TensorSpec([], tf.bool)), variables + list(optimizer.variables), optimizer
