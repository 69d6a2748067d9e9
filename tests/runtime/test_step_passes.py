"""The passes that make an optimized step's GraphDef: each one's output imports as a graph, and those that
apply to a plan are those that change the step."""

import tensorflow as tf

from seqmem.runtime.optimize import optimize
from seqmem.runtime.step_passes import STEP_PASSES, rewritten_graph_def
from seqmem.units import MIB


def _imports(name, graph_def):
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")


def test_each_pass_makes_a_graph_and_the_loop_passes_apply_to_a_loop_swapped_step():
    from models.nmt.benchmark import training_step

    step, _, specs = training_step(8, 30, 64, vocab=100)
    before = optimize(step, 1e6, input_signature=specs).plan.predicted_peak_before_bytes
    optimized = optimize(step, 0.6 * before / MIB, input_signature=specs, safety_margin=0.0, calibrate=False)
    plan = optimized.plan
    assert plan.loop_swaps and plan.loop_parallel_iterations == 1
    checked = []
    result = rewritten_graph_def(optimized.analysis, plan, optimized.backend,
                                 check=lambda name, graph_def: checked.append(_imports(name, graph_def) or name))
    assert checked == [step_pass.name for step_pass in STEP_PASSES]  # every pass applies to this plan
    assert {"swap loop accumulators", "bound loops", "pin loop bodies"} <= set(result.changed)
    assert result.graph_def == optimized.graph_def  # what the step runs
