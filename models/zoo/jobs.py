"""The zoo's two jobs, each run in a fresh emulated-device process (`seqmem.runtime.device.run_with_budget`).

`original` trains a zoo step as it is written; `optimized` trains it through
`seqmem.optimize` for a budget. Both run with op determinism, build the step
from the same seeds, and train `steps` calls on the same inputs, so that their
losses and final variables can be compared bit for bit across processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

__all__ = ["analyzed", "arrival_sums", "digest", "loss_found", "optimized", "optimized_step", "original",
           "predicted", "trained"]


def original(name: str, batch: int, steps: int, grappler_off: tuple[str, ...] = ()) -> dict[str, Any]:
    """Train zoo step `name` at `batch` as written: `predicted`'s fields, then `trained`'s, and the sums its
    graph adds as their terms arrive (`arrival_sums`). grappler_off: Grappler optimizers switched off in this
    process (`tf.config.optimizer.set_experimental_options` names)."""
    from tensorflow.python.eager import context

    built = _built(name, batch, grappler_off)
    analysis = analyzed(built)
    context.enable_graph_collection()  # the graphs TensorFlow runs, collected as it instantiates the step
    try:
        fields = trained(built, steps)
        fields["arrival_sums"] = arrival_sums(context.export_run_metadata())
    finally:
        context.disable_graph_collection()
    return {**predicted(built, analysis), **fields}


def optimized(name: str, batch: int, budget_mb: int, steps: int,
              grappler_off: tuple[str, ...] = ()) -> dict[str, Any]:
    """Train zoo step `name` at `batch` through `seqmem.optimize`: `optimized_step`'s fields, then
    `trained`'s; only the former when no plan fits the budget. grappler_off: as `original`'s."""
    step, fields = optimized_step(_built(name, batch, grappler_off), budget_mb)
    return fields if step is None else {**fields, **trained(step, steps)}


def analyzed(built):
    """seqmem's analysis of the `ZooStep` as written, made before its first call (kernels' scratch measured,
    as `optimize` does)."""
    from seqmem.runtime.step_analysis import analyze_function

    function = built.step.get_concrete_function(*built.inputs)
    return analyze_function(function, measure_scratch=True, count_loops=True, sample_inputs=built.inputs)


def predicted(built, analysis) -> dict[str, Any]:
    """seqmem's predicted peak (bytes) of one call of the `ZooStep` as written, in the order it was seen
    running in (two more calls, the second profiled: make them after the calls whose losses count), as
    `seqmem.profile` predicts a step it runs; and the loss `analysis` found (`loss_found`)."""
    from seqmem.edge.op_trace import trace_ops
    from seqmem.sim.simulator import simulate

    ran = analysis.as_ran(trace_ops(built.step, built.inputs, runs=1).started)
    peak = simulate(ran.graph, ran.order, allocator="bfc", **ran.simulator_options()).peak_bytes
    return {"predicted_peak_bytes": peak, **loss_found(analysis)}


def optimized_step(built, budget_mb: float):
    """(the `ZooStep` with its step through `seqmem.optimize(step, budget_mb, sample_inputs=...)`, fields):
    the plan's predicted peak and digest (`seqmem.runtime.workers.plan_digest`), the loss found, decisions,
    loop swaps and the seconds `optimize` took. A budget no plan fits gives (None, {"infeasible": the
    error's message, "smallest_peak_bytes": ..., "floor": what that peak is made of (`_floor_fields`),
    "unplaced": what the allocator model said where it placed no plan's buffers, "optimize_s": ...})."""
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime.optimize import optimize
    from seqmem.runtime.workers import plan_digest

    started = time.perf_counter()
    try:
        step = optimize(built.step, budget_mb, sample_inputs=built.inputs)
    except InfeasibleBudgetError as error:
        return None, {"infeasible": str(error)[:600], "smallest_peak_bytes": error.smallest_peak_bytes,
                      "floor": _floor_fields(error.floor), "unplaced": error.unplaced,
                      "optimize_s": time.perf_counter() - started}
    optimize_s, plan = time.perf_counter() - started, step.plan
    return dataclasses.replace(built, step=step), {
        "predicted_peak_bytes": plan.predicted_peak_after_bytes, **loss_found(step.analysis),
        "decisions": len(plan.decisions), "loop_swaps": len(plan.loop_swaps), "optimize_s": optimize_s,
        "plan_digest": str(plan_digest(plan))}


def _floor_fields(floor) -> dict[str, Any] | None:
    """A `seqmem.plan.floor.Floor` as JSON fields (bytes), its three largest held buffers listed; None for
    None."""
    if floor is None:
        return None
    held = [{"tensor": str(b.tensor), "size_bytes": b.size_bytes, "why": b.why} for b in floor.held[:3]]
    return {"op": floor.op, "op_type": floor.op_type, "until": floor.until, "until_type": floor.until_type,
            "peak_bytes": floor.peak_bytes,
            "persistent_bytes": floor.persistent_bytes, "working_bytes": floor.working_bytes,
            "held_bytes": floor.held_bytes, "largest_held": held}


def _built(name: str, batch: int, grappler_off: tuple[str, ...] = ()):
    import tensorflow as tf

    from models.zoo.steps import STEPS

    tf.config.experimental.enable_op_determinism()
    if grappler_off:
        tf.config.optimizer.set_experimental_options({optimizer: False for optimizer in grappler_off})
    return STEPS[name].build(batch)


def trained(built, steps: int) -> dict[str, Any]:
    """Call the `ZooStep` `steps` times: losses, peaks (bytes, each call's, and the highest), the median
    seconds of the calls after the first, the digest of its variables after."""
    from seqmem.runtime import device

    losses, peaks, seconds = [], [], []
    for _ in range(steps):
        device.reset_peak()
        started = time.perf_counter()
        losses.append(float(built.step(*built.inputs)))
        seconds.append(time.perf_counter() - started)
        peaks.append(device.memory_stats().peak_bytes)
    later = sorted(seconds[1:]) or seconds
    return {"losses": losses, "digest": digest(built.variables), "peak_bytes": max(peaks), "peaks": peaks,
            "step_s": later[len(later) // 2]}


def arrival_sums(metadata) -> list[str]:
    """The sums (`AddN` nodes) that Grappler's memory optimizer made, in the graphs of `metadata` (a
    RunMetadata whose graphs were collected as the step was instantiated), into a temporary variable each term
    is added to as it arrives (`<AddN>/tmp_var`): their values depend on the order the executor runs the
    terms' producers in."""
    return sorted({node.name.removesuffix("/tmp_var") for function in metadata.function_graphs
                   for graph in function.partition_graphs for node in graph.node if node.op == "TemporaryVariable"})


def digest(variables) -> str:
    """SHA-256 of every variable's bytes, in order: equal digests, bit-for-bit equal variables."""
    hasher = hashlib.sha256()
    for variable in variables:
        hasher.update(variable.numpy().tobytes())
    return hasher.hexdigest()


def loss_found(analysis) -> dict[str, Any]:
    """The losses seqmem found, and whether they are the tensor the step returns, that tensor scaled (an op
    that reads it directly, as `LossScaleOptimizer.get_scaled_loss` multiplies it), or the terms it sums
    (a GAN's step returns its two losses summed); a data-parallel step returns every worker's loss summed
    (an all-reduce of it, packed and unpacked by reshapes and a split)."""
    graph = analysis.graph
    (returned,) = graph.outputs  # every zoo step returns its loss alone
    node = graph.node(returned.node)
    while node.op in ("Identity", "Reshape", "SplitV", "CollectiveReduceV2"):
        returned = node.inputs[0]
        node = graph.node(returned.node)
    found = analysis.anatomy.losses
    scaled = len(found) == 1 and returned in graph.node(found[0].node).inputs
    correct = set(found) in ({returned}, _summed_terms(graph, returned)) or scaled
    return {"loss": ", ".join(f"{ref.node}:{ref.index}" for ref in found), "loss_correct": correct}


def _summed_terms(graph, ref) -> set:
    """The tensors the adds that make `ref` sum (`ref` itself where an add does not make it)."""
    from seqmem.ir.op_tables import SUM_OPS

    node = graph.node(ref.node)
    if node.op not in SUM_OPS:
        return {ref}
    return set().union(*(_summed_terms(graph, term) for term in node.inputs))
