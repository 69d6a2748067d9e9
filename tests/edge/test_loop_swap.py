"""seqmem.edge.loop_swap: a loop's saved activations go to host memory, element by element, results unchanged."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from seqmem.edge.loop_swap import loop_accumulators, swap_loop_accumulators
from seqmem.edge.loops import bound_loops
from seqmem.runtime.device import run_with_budget
from seqmem.runtime.optimized_step import graph_def_runner


def _nmt_step(batch, time_steps, units):
    """(concrete function, flat inputs, the tf.function: it owns the variables the function holds weakly)."""
    from models.nmt.benchmark import training_step

    step, inputs, specs = training_step(batch, time_steps, units, vocab=100)
    return step.get_concrete_function(*specs), tf.nest.flatten(inputs), step


def _losses_and_weights(run, inputs, variables, start, steps=2):
    for variable, value in zip(variables, start):
        variable.assign(value)
    losses = [float(tf.nest.flatten(run(*inputs))[0]) for _ in range(steps)]
    return losses, [v.numpy() for v in variables]


@pytest.fixture(scope="module")
def small_nmt_step():
    return _nmt_step(4, 6, 16)


def test_decoder_accumulators_swapped_train_bit_identically(small_nmt_step):
    tf.config.experimental.enable_op_determinism()
    function, inputs, _step = small_nmt_step
    graph_def = function.graph.as_graph_def()
    swaps = loop_accumulators(graph_def)
    names = [swap.accumulator for swap in swaps]
    assert any("BahdanauAttention/Tanh_0" in name for name in names)  # the [B, T, H] tanh kept every step
    assert not any("ReadVariableOp" in name or "Less_0" in name for name in names)  # variable reads, bools
    assert all(swap.dtype == "float32" and swap.element_bytes for swap in swaps)
    swapped = bound_loops(swap_loop_accumulators(graph_def, swaps), 1)
    ops = [n.op for f in swapped.library.function for n in f.node_def]
    assert ops.count("SerializeTensor") == len(swaps) and ops.count("ParseTensor") == len(swaps)
    variables = list(function.graph.variables)
    start = [v.numpy() for v in variables]
    original = _losses_and_weights(function, inputs, variables, start)
    rewritten = _losses_and_weights(graph_def_runner(function, swapped), inputs, variables, start)
    assert original[0] == rewritten[0]
    assert all(np.array_equal(a, b) for a, b in zip(original[1], rewritten[1]))


def test_no_swaps_and_foreign_swaps(small_nmt_step):
    graph_def = small_nmt_step[0].graph.as_graph_def()
    unchanged = swap_loop_accumulators(graph_def, [])
    assert unchanged.SerializeToString(deterministic=True) == graph_def.SerializeToString(deterministic=True)
    foreign = dataclasses.replace(loop_accumulators(graph_def)[0], forward_index=0)
    with pytest.raises(ValueError, match="not swappable loop accumulators of this graph"):
        swap_loop_accumulators(graph_def, [foreign])


def median_peak_and_list_bytes(time_steps, swapped):
    """Child process: the NMT step's median measured peak (bytes, 3 steps) with its loops bounded, and
    with every loop accumulator swapped too if `swapped`; and the bytes those lists hold."""
    import statistics

    from seqmem.runtime.measure import timed_steps

    function, inputs, _step = _nmt_step(8, time_steps, 256)
    graph_def = bound_loops(function.graph.as_graph_def(), 1)
    swaps = loop_accumulators(graph_def)
    if swapped:
        graph_def = swap_loop_accumulators(graph_def, swaps)
    peaks, _ = timed_steps(graph_def_runner(function, graph_def), inputs, 3)
    return statistics.median(peaks), time_steps * sum(swap.element_bytes for swap in swaps)


@pytest.mark.device
def test_swapped_accumulators_leave_the_device():
    # measured, one stream (2026-11-22; T=50, batch 8, 256 units, one process each): bounded 62.3-75.7 MB,
    # swapped 37.7-56.3 MB, the lists 24.8 MB (the first step after the warm-up peaks highest)
    runs = [run_with_budget(median_peak_and_list_bytes, 50, swap, budget_mb=1024) for swap in (False, True)]
    assert all(run.ok for run in runs), [run.message for run in runs]
    (bounded, list_bytes), (swapped, _) = [run.value for run in runs]
    assert list_bytes > 20 << 20 and bounded - swapped > 0.75 * list_bytes, (bounded, swapped, list_bytes)
