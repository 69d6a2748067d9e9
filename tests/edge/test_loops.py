"""seqmem.edge.loops: every while loop bounded, in the graph and in called functions, results unchanged."""

import pytest
import tensorflow as tf

from seqmem.edge.loops import bound_loops, loops_above
from seqmem.decisions.plan import Plan
from tests.edge.rnn_step import assert_trains_the_same, rnn_step


def _loop_bounds(graph_def):
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return [n.attr["parallel_iterations"].i for n in nodes if n.op in ("While", "StatelessWhile")]


def test_every_loop_is_bounded_and_the_step_computes_the_same(op_determinism):
    function, variables, inputs, _owners = rnn_step()
    graph_def = function.graph.as_graph_def()
    assert len(loops_above(graph_def, 1)) >= 4  # the while_loop, the LSTM's, and a gradient loop of each
    bounded = bound_loops(graph_def, 1)
    assert loops_above(bounded, 1) == [] and set(_loop_bounds(bounded)) == {1}
    assert _loop_bounds(graph_def) and set(_loop_bounds(graph_def)) != {1}  # the input is left as it was
    copies = [f.signature.name for f in bounded.library.function if f.signature.name.endswith("_seqmem_loops1")]
    originals = {f.signature.name for f in graph_def.library.function}
    assert copies and not {name.removesuffix("_seqmem_loops1") for name in copies} & {
        f.signature.name for f in bounded.library.function}
    assert len(bounded.library.function) == len(originals)

    assert_trains_the_same(function, variables, inputs, bounded)


def test_a_graph_without_loops_is_returned_as_it_was():
    step = tf.function(lambda x: tf.reduce_sum(tf.nn.relu(x)))
    graph_def = step.get_concrete_function(tf.TensorSpec([3])).graph.as_graph_def()
    assert loops_above(graph_def, 1) == [] and bound_loops(graph_def, 1) == graph_def


def test_loops_bounded_lower_keep_their_bound():
    function, _variables, _, _owners = rnn_step()
    graph_def = function.graph.as_graph_def()
    bounded = bound_loops(bound_loops(graph_def, 2), 4)
    assert set(_loop_bounds(bounded)) == {2} and loops_above(bounded, 2) == []


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, "1", None])
def test_a_bound_that_is_not_a_positive_int_is_refused(bound):
    graph_def = tf.function(lambda x: x).get_concrete_function(tf.TensorSpec([1])).graph.as_graph_def()
    with pytest.raises(ValueError, match="parallel_iterations must be a positive int"):
        bound_loops(graph_def, bound)


def test_optimize_bounds_the_loops_of_a_step_that_fits_and_says_so():
    from seqmem.runtime.optimize import optimize

    function, _variables, _, _owners = rnn_step()
    step = optimize(function, 1e5, calibrate=False)
    assert not step.plan.decisions and step.plan.loop_parallel_iterations == 1
    assert set(_loop_bounds(step.graph_def)) == {1}
    assert "at most 1 iteration(s) at once" in step.plan.summary()
    assert Plan.from_json(step.plan.to_json()) == step.plan
    assert optimize(function, 1e5, calibrate=False, loop_parallel_iterations=None).plan.loop_parallel_iterations is None
    with pytest.raises(ValueError, match="parallel_iterations must be a positive int, got 0"):
        optimize(function, 1e5, loop_parallel_iterations=0)

    weight = tf.Variable(tf.ones([3, 3]))

    @tf.function(input_signature=[tf.TensorSpec([2, 3])])
    def no_loops(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(x @ weight))
        weight.assign_sub(tape.gradient(loss, weight))
        return loss

    unchanged = optimize(no_loops, 1e5, calibrate=False)
    assert unchanged.plan.loop_parallel_iterations is None and unchanged._run is no_loops
