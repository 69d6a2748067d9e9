"""A loop that runs until its data says so (a decoder without `maximum_iterations`): its trip count is
measured on the step's arguments, and the lists it fills for its gradient get their size from it."""

import numpy as np
import tensorflow as tf

from seqmem.edge import capture, list_sizes
from seqmem.runtime.trip_counts import measured_trip_counts

BATCH, STEPS, UNITS = 4, 6, 8


def _decoder_step():
    """A step whose loop runs until every sequence has ended (`lengths`, an input), saving what its
    gradient needs in accumulators, as tfa's `dynamic_decode` does without `maximum_iterations`."""
    kernel = tf.Variable(tf.random.stateless_normal([UNITS, UNITS], seed=[0, 1]))

    @tf.function
    def step(inputs, lengths):
        with tf.GradientTape() as tape:
            def cond(t, state, total):
                return tf.logical_not(tf.reduce_all(t >= lengths))

            def body(t, state, total):
                state = tf.tanh(tf.matmul(state, kernel) + inputs[:, t])
                return t + 1, state, total + tf.reduce_sum(state)

            _, _, total = tf.while_loop(cond, body, (0, tf.zeros([BATCH, UNITS]), 0.0))
            loss = total / BATCH
        kernel.assign_sub(0.1 * tape.gradient(loss, kernel))
        return loss

    inputs = tf.constant(np.random.default_rng(0).standard_normal([BATCH, STEPS, UNITS]).astype(np.float32))
    return step, inputs


def _accumulator_sizes(graph, loop):
    """size_bytes of the lists `loop` fills for its gradient (its outputs whose element_bytes is set or unknown)."""
    return [info.size_bytes for info in graph.node(loop).outputs if info.dtype == "variant"]


def test_the_trip_count_of_a_data_dependent_loop_is_measured_and_sizes_its_lists():
    step, inputs = _decoder_step()
    lengths = tf.constant([3, 5, 2, 4])
    function = step.get_concrete_function(inputs, lengths)
    (loop,) = list_sizes.unbounded_loops(function)
    counts = measured_trip_counts(function, [loop], (inputs, lengths))
    assert counts == {loop: 5}
    unsized = _accumulator_sizes(capture.from_tf(function), loop)
    sized = _accumulator_sizes(capture.from_tf(function, trip_counts=counts), loop)
    assert None in unsized
    # the tanh's outputs saved for its gradient: one [BATCH, UNITS] float element per iteration
    assert 5 * BATCH * UNITS * 4 in sized and None not in sized


def test_a_loop_with_a_constant_bound_needs_no_run():
    @tf.function
    def step(x):
        return tf.while_loop(lambda i, y: i < 7, lambda i, y: (i + 1, y * 2.0), (0, x))[1]

    assert list_sizes.unbounded_loops(step.get_concrete_function(tf.TensorSpec([2]))) == []
