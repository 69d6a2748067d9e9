"""seqmem.edge.whole_calls: a step's function calls kept whole (not inlined), results unchanged."""

import numpy as np
import pytest
import tensorflow as tf

from seqmem.edge.whole_calls import keep_calls_whole
from seqmem.ir.op_tables import FUNCTION_CALL_OPS
from seqmem.runtime import device
from seqmem.runtime.optimized_step import graph_def_runner


def _lstm_step():
    """A Keras LSTM training step (its forward and backward passes are called functions): (concrete
    function, variables, inputs, the objects that own its variables: a function holds them weakly)."""
    tf.keras.utils.set_random_seed(0)
    lstm = tf.keras.layers.LSTM(8, return_sequences=True)
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function(autograph=False)
    def step(sequence):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(lstm(sequence) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, lstm.trainable_variables), lstm.trainable_variables))
        return loss

    function = step.get_concrete_function(tf.TensorSpec([4, 6, 3]))
    return function, lstm.trainable_variables, tf.random.normal([4, 6, 3]), (lstm, optimizer)


def _called(graph_def):
    return {node.attr["f"].func.name for node in graph_def.node if node.op in FUNCTION_CALL_OPS}


def test_each_called_function_is_a_copy_marked_noinline_and_the_step_computes_the_same(op_determinism):
    function, variables, inputs, _owners = _lstm_step()
    graph_def = function.graph.as_graph_def()
    whole = keep_calls_whole(graph_def)
    functions = {f.signature.name: f for f in whole.library.function}
    called = _called(whole)
    assert len(called) >= 2  # the LSTM's forward and backward functions
    assert all(name.endswith("_seqmem_whole") and functions[name].attr["_noinline"].b for name in called)
    assert {name.removesuffix("_seqmem_whole") for name in called} == _called(graph_def)
    assert not any(f.attr["_noinline"].b for f in graph_def.library.function)  # the input is left as it was

    start = [v.numpy() for v in variables]
    results = []
    for run in (function, graph_def_runner(function, whole)):
        for variable, value in zip(variables, start):
            variable.assign(value)
        losses = [float(tf.nest.flatten(run(inputs))[0]) for _ in range(3)]
        results.append((losses, [v.numpy() for v in variables]))
    (losses, weights), (whole_losses, whole_weights) = results
    assert losses == whole_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, whole_weights))


def test_a_graph_without_calls_is_returned_as_it_was():
    graph_def = tf.function(lambda x: tf.reduce_sum(tf.nn.relu(x))).get_concrete_function(
        tf.TensorSpec([3])).graph.as_graph_def()
    assert keep_calls_whole(graph_def) == graph_def


def ops_that_allocate_in_a_call(whole):
    """Allocation trace of the LSTM step's graph with its loops bounded, as `optimize` runs it, inlined or kept
    whole: how many allocations a node named inside a call's scope made (an inlined body's nodes are named
    `<call node>/<node>`). (Keras' own LSTM functions, marked `api_implements`, are not inlined; the bounded
    copies are not so marked.)"""
    from seqmem.edge.allocation_trace import trace_allocations
    from seqmem.edge.loops import bound_loops

    function, _variables, inputs, _owners = _lstm_step()
    graph_def = bound_loops(function.graph.as_graph_def(), 1)
    run = graph_def_runner(function, keep_calls_whole(graph_def) if whole else graph_def)
    trace = trace_allocations(run, [inputs])
    return sum(1 for event in trace.events if event.allocated and "PartitionedCall/" in event.op)


@pytest.mark.device
def test_a_call_kept_whole_runs_its_body_in_its_own_executor():
    inlined = device.run_with_budget(ops_that_allocate_in_a_call, False, budget_mb=256)
    whole = device.run_with_budget(ops_that_allocate_in_a_call, True, budget_mb=256)
    assert inlined.ok and whole.ok, (inlined.message, whole.message)
    assert inlined.value > 0 and whole.value == 0
