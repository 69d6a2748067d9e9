"""`optimize` on a step whose memory lives in a loop: the accumulators of the NMT step's decoder and of recurrent
layers (seqmem's, and Keras' LSTM, GRU and bidirectional, whose loops run in called functions) are swapped element
by element, the step trains bit-identically and fits the budget the plan was made for; every pass that makes such
a step's GraphDef applies to it and leaves a graph TensorFlow imports."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from seqmem.errors import InfeasibleBudgetError
from seqmem.runtime.device import run_with_budget
from seqmem.runtime.optimize import optimize
from seqmem.runtime.step_passes import STEP_PASSES, rewritten_graph_def
from seqmem.units import MIB


def _nmt_step(batch, time_steps, units, vocab=100):
    from models.nmt.benchmark import training_step

    return training_step(batch, time_steps, units, vocab=vocab)


def test_loop_swapped_nmt_step_trains_bit_identically(op_determinism):
    step, inputs, specs = _nmt_step(8, 30, 64)
    before = optimize(step, 1e6, input_signature=specs).plan.predicted_peak_before_bytes
    # at 0.6 of the peak most decoder lists go (14; at 0.8 of it, one: the attention's [B, T, H] tanh)
    optimized = optimize(step, 0.6 * before / MIB, input_signature=specs, safety_margin=0.0, calibrate=False)
    plan = optimized.plan
    assert len(plan.loop_swaps) >= 10 and plan.loop_parallel_iterations == 1 and plan.feasible
    assert "loop(s) swapped element by element" in plan.summary()
    # every pass that makes the step's GraphDef applies to this plan but the branch restores (it has no
    # conditional) and the branches' pins (it is not pinned), and each one's output imports as a graph
    checked = []
    passes = rewritten_graph_def(optimized.analysis, plan, optimized.backend,
                                 check=lambda name, graph_def: checked.append(_imported(name, graph_def)))
    assert checked == [step_pass.name for step_pass in STEP_PASSES
                       if step_pass.name not in ("pin branches", "restore in branches")]
    assert {"swap loop accumulators", "bound loops", "pin loop bodies"} <= set(passes.changed)
    assert passes.graph_def.SerializeToString(deterministic=True) \
        == optimized.graph_def.SerializeToString(deterministic=True)  # what the step runs (a NaN constant: not ==)
    (losses, weights), (optimized_losses, optimized_weights) = _trained((step, optimized), optimized, inputs, 2)
    assert losses == optimized_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, optimized_weights))


def _imported(name, graph_def):
    """`name`, once `graph_def` imported into a graph without error."""
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return name


def _trained(runs, optimized, inputs, steps):
    """For each of `runs`, started from the same variable values: its losses over `steps` steps and its
    variables' values after them (the variables of `optimized`'s step)."""
    variables = list(optimized.function.graph.variables)
    start = [v.numpy() for v in variables]
    results = []
    for run in runs:
        for variable, value in zip(variables, start):
            variable.assign(value)
        losses = [float(run(*inputs)) for _ in range(steps)]
        results.append((losses, [v.numpy() for v in variables]))
    return results


def test_a_step_with_one_decoder_list_swapped_trains_bit_identically(op_determinism):
    # swapping the attention's softmax list alone changed which of the gradient iteration's sums TensorFlow's
    # graph optimizer collapsed (a pinned chain keeps it from collapsing a node it holds), and their order
    from seqmem.runtime.optimized_step import build_step

    step, inputs, specs = _nmt_step(8, 30, 64)
    optimized = optimize(step, 1e6, input_signature=specs, calibrate=False, loop_parallel_iterations=1)
    softmax = [swap for swap in optimized.analysis.loop_swaps if "Softmax" in swap.accumulator]
    assert len(softmax) == 1
    swapped = build_step(optimized.analysis, dataclasses.replace(optimized.plan, loop_swaps=tuple(softmax)),
                         optimized.backend, optimized.function, step)
    (_, weights), (_, swapped_weights) = _trained((step, swapped), optimized, inputs, 1)
    assert all(np.array_equal(a, b) for a, b in zip(weights, swapped_weights))


def planned_and_measured(model, budget_mb, safety_margin=0.1):
    """Child process: `optimize` a step for `budget_mb`: "nmt" (T=50, batch 8, 256 units, vocabulary 1000) or
    "keras lm" (two Keras LSTM layers of 128 units, 35 steps, batch 64, vocabulary 100); its plan, and its
    median measured peak over 3 steps (bytes)."""
    import statistics

    from models.lm.benchmark import training_step
    from seqmem.runtime.measure import timed_steps

    step, inputs, specs = _nmt_step(8, 50, 256, vocab=1000) if model == "nmt" else training_step(64, 2, 128, 35, 100)
    optimized = optimize(step, budget_mb, input_signature=specs, safety_margin=safety_margin, calibrate=False)
    peaks, _ = timed_steps(optimized, inputs, 3)
    return optimized.plan, statistics.median(peaks)


@pytest.mark.device
def test_loop_swaps_fit_a_budget_the_bounded_step_exceeds():
    # measured, one stream (2026-11-26, on the change that sizes the gradient's list of the decoder outputs):
    # the step bounded, predicted 76.4 MB; planned for 66 MB: 9 lists swapped, predicted 56.4 MB, median
    # 55.0 MB (for 64 MB the plan also swaps one feature map)
    budget_mb = 66
    run = run_with_budget(planned_and_measured, "nmt", budget_mb, budget_mb=1024)
    assert run.ok, run.message
    plan, measured = run.value
    values = [round(v / MIB, 1) for v in (plan.predicted_peak_before_bytes, plan.predicted_peak_after_bytes, measured)]
    assert plan.predicted_peak_before_bytes > budget_mb * MIB and not plan.decisions, values  # loop swaps alone
    assert plan.loop_swapped_bytes > 20 * MIB and measured <= budget_mb * MIB, values
    assert abs(plan.predicted_peak_after_bytes - measured) <= 0.1 * measured, values


@pytest.mark.device
def test_keras_lstm_loops_swapped_fit_a_budget_the_step_exceeds():
    # Keras runs an LSTM's loops in functions that Grappler would trade for the unedited originals
    # (seqmem.edge.library): here the swapped lists must show in the measured peak
    budget_mb = 20
    # planned for 16 MB: the same step's plan for 18 MB (10 lists, 17.9 MB predicted) measured 18.6-20.9 MB in
    # six processes, a spread the arena's layout makes at this size
    run = run_with_budget(planned_and_measured, "keras lm", budget_mb, 0.2, budget_mb=1024)
    assert run.ok, run.message
    plan, measured = run.value
    values = [round(v / MIB, 1) for v in (plan.predicted_peak_before_bytes, plan.predicted_peak_after_bytes, measured)]
    # measured, one stream (2026-11-26, five processes): 29.3 MB predicted unswapped; 13 of the 16 lists (two
    # loops of 8) swapped, 15.6 MB predicted, 16.0-17.7 MB measured
    assert plan.predicted_peak_before_bytes > 1.3 * budget_mb * MIB and 8 < len(plan.loop_swaps) < 16, values
    assert measured <= budget_mb * MIB and abs(plan.predicted_peak_after_bytes - measured) <= 0.25 * measured, values


def _recurrent_layers(name):
    """(layers, forward loops they run)."""
    from seqmem.layers.recurrent import MemoryEfficientGRU, MemoryEfficientLSTM

    if name == "memory-efficient GRU x2":  # top-level loops
        return [MemoryEfficientGRU(64, return_sequences=True) for _ in range(2)], 2
    if name == "memory-efficient LSTM x2":  # loops that save nothing for backward (here no swap lowers the peak)
        return [MemoryEfficientLSTM(64, return_sequences=True) for _ in range(2)], 0
    if name == "Keras LSTM x2":  # loops inside Keras' functions, as are the GRU's and the bidirectional's
        return [tf.keras.layers.LSTM(64, return_sequences=True) for _ in range(2)], 2
    if name == "Keras GRU":
        return [tf.keras.layers.GRU(64, return_sequences=True)], 1
    return [tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(64, return_sequences=True))], 2


@pytest.mark.parametrize("layers", ["memory-efficient GRU x2", "memory-efficient LSTM x2", "Keras LSTM x2",
                                    "Keras GRU", "bidirectional LSTM"])
def test_recurrent_layers_loops_are_swapped_and_train_bit_identically(layers, op_determinism):
    tf.keras.utils.set_random_seed(0)
    recurrent, loops = _recurrent_layers(layers)
    model = tf.keras.Sequential([tf.keras.layers.Embedding(50, 32), *recurrent, tf.keras.layers.Dense(50)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    tokens = tf.random.stateless_uniform([16, 40], seed=[1, 2], maxval=50, dtype=tf.int32)
    model(tokens)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(x, logits, from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    specs = [tf.TensorSpec(tokens.shape, tokens.dtype)]
    with pytest.raises(InfeasibleBudgetError) as infeasible:  # the lowest peak: loops swapped
        optimize(step, 0.1, input_signature=specs, safety_margin=0.0, calibrate=False)
    budget_mb = 1.02 * infeasible.value.smallest_peak_bytes / MIB
    optimized = optimize(step, budget_mb, input_signature=specs, safety_margin=0.0, calibrate=False)
    # the layers' loops, as many as lower the peak
    swapped = {swap.forward_loop for swap in optimized.plan.loop_swaps}
    assert (0 < len(swapped) <= loops) if loops else not swapped, swapped
    start = [v.numpy() for v in model.variables]
    results = []
    for run in (step, optimized):
        for variable, value in zip(model.variables, start):
            variable.assign(value)
        results.append(([float(run(tokens)) for _ in range(2)], [v.numpy() for v in model.variables]))
    assert results[0][0] == results[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(results[0][1], results[1][1]))
