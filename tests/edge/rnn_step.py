"""A small training step with loops (a tf.while_loop and a Keras LSTM) for the edge rewrites' tests, and a
check that a rewritten graph of it trains exactly as the step does."""

import numpy as np
import tensorflow as tf

from seqmem.edge.runner import graph_def_runner


def rnn_step():
    """A training step with a top-level tf.while_loop and a Keras LSTM (its loop inside called functions,
    its cell splitting its gates four ways), both differentiated: forward and gradient loops. Returns
    (concrete function, trained variables, inputs, the objects that own its variables: a function holds
    its variables weakly)."""
    tf.keras.utils.set_random_seed(0)
    lstm = tf.keras.layers.LSTM(8, return_sequences=True)
    weight = tf.Variable(tf.random.normal([8, 8]) * 0.3)
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function(autograph=False)
    def step(sequence):
        with tf.GradientTape() as tape:
            outputs = lstm(sequence)
            final = tf.while_loop(lambda i, h: i < 6, lambda i, h: (i + 1, tf.tanh(h @ weight + outputs[:, i])),
                                  (tf.constant(0), tf.zeros([4, 8])), parallel_iterations=10)[1]
            loss = tf.reduce_sum(final ** 2)
        variables = lstm.trainable_variables + [weight]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    inputs = tf.random.normal([4, 6, 3])
    function = step.get_concrete_function(tf.TensorSpec([4, 6, 3]))
    return function, lstm.trainable_variables + [weight], inputs, (lstm, optimizer)


def assert_trains_the_same(function, variables, inputs, graph_def, steps=3):
    """Three steps of `graph_def` (`function`'s graph, rewritten) give the losses and variables three steps
    of `function` give, bit for bit, from the same start (restored after)."""
    start = [v.numpy() for v in variables]
    results = []
    for run in (function, graph_def_runner(function, graph_def)):
        for variable, value in zip(variables, start):
            variable.assign(value)
        losses = [float(tf.nest.flatten(run(inputs))[0]) for _ in range(steps)]
        results.append((losses, [v.numpy() for v in variables]))
    for variable, value in zip(variables, start):
        variable.assign(value)
    (losses, weights), (rewritten_losses, rewritten_weights) = results
    assert losses == rewritten_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, rewritten_weights))
