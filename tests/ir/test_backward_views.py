"""Backward readers of a forward view get their own view (`seqmem.ir.backward_views`): a Keras `Dense` on a
[B, T, H] input, whose weight gradient reads the forward `Tensordot` reshape of the previous layer's
activation, can then have that activation swapped; and the step computes what it computed."""

import numpy as np
import tensorflow as tf

import seqmem
from seqmem.plan import choose_conservations
from seqmem.runtime.step_analysis import analyze_function
from seqmem.ir.backward_views import BACKWARD_VIEW_SCOPE


def _step():
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input([16, 32]), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(32), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(8)])
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step, model


def _inputs():
    return [tf.constant(np.random.default_rng(i).normal(size=[64, 16, 32]), tf.float32) for i in range(3)]


def test_the_weight_gradient_reads_a_view_of_its_own_and_the_activation_is_swapped():
    step, _ = _step()
    analysis = analyze_function(step.get_concrete_function(*_inputs()[:1]))
    graph = analysis.graph
    copies = [name for name in graph.nodes if name.startswith(BACKWARD_VIEW_SCOPE)]
    assert copies and all(name in analysis.anatomy.backward for name in copies)
    for name in copies:  # each read by one backward op, after that op's other backward inputs
        (reader,) = graph.successors(name)
        assert reader in analysis.anatomy.backward and graph.node(name).control_inputs
    relu = next(ref for ref in analysis.anatomy.feature_maps if graph.node(ref.node).op == "Relu"
                and graph.tensor(ref).shape[-1] == 256)
    lowest = choose_conservations(analysis, 1 << 30, target_bytes=1).plan
    assert relu in {decision.tensor for decision in lowest.decisions}


def test_the_step_with_its_own_views_and_swaps_computes_what_it_computed(op_determinism):
    inputs = _inputs()
    step, model = _step()
    expected = [float(step(x)) for x in inputs] + [w.numpy() for w in model.trainable_variables]
    step, model = _step()
    analysis = analyze_function(step.get_concrete_function(inputs[0]))
    budget_mb = choose_conservations(analysis, 1 << 30, target_bytes=1).plan.predicted_peak_after_bytes / 2 ** 20
    optimized = seqmem.optimize(step, budget_mb * 1.02, sample_inputs=inputs[:1], safety_margin=0)
    assert any(name.startswith(BACKWARD_VIEW_SCOPE) for name in optimized.analysis.graph.nodes)
    assert optimized.plan.decisions
    got = [float(optimized(x)) for x in inputs] + [w.numpy() for w in model.trainable_variables]
    for actual, wanted in zip(got, expected):
        np.testing.assert_array_equal(actual, wanted)
