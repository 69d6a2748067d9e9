"""Analyze a TensorFlow training step: capture it, measure what needs a device, then `analyze_graph`."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any, Optional

import tensorflow as tf

from seqmem.analyze.analysis import StepAnalysis, analyze_graph
from seqmem.analyze.anatomy import LossNames
from seqmem.analyze.critical_path import MachineModel
from seqmem.edge import capture, list_sizes
from seqmem.gc_pause import gc_paused
from seqmem.edge.bodies import body_memory, handed_over
from seqmem.edge.head_nodes import blocked_head
from seqmem.edge.variable_shapes import variable_shapes
from seqmem.edge.loop_swap import loop_accumulators
from seqmem.runtime.trip_counts import measured_trip_counts
from seqmem.ir.graph import Graph
from seqmem.ir.op_tables import FUNCTIONAL_OPS
from seqmem.runtime import device
from seqmem.runtime.measure import inputs_like
from seqmem.sim.calls import CallCharge
from seqmem.sim.iteration import Iteration
from seqmem.sim.simulator import simulate
from seqmem.decisions.plan import BlockedHead, LoopSwap
from seqmem.rewrite.vocabulary_head import find_heads

__all__ = ["analyze_function", "inter_op_threads", "predicted_peak_bytes", "with_blocked_heads"]

# A blocked head's row blocks: one block's [rows, V] logits take at most this share of the memory budget. A
# block holds about three such tensors at once (logits, softmax gradient, scaled gradient); more blocks
# cost only ops (the products are as large in total).
_BLOCK_SHARE_OF_BUDGET = 1 / 64


def analyze_function(
    function: Any,
    *,
    loss: LossNames = None,
    machine: MachineModel = MachineModel(),
    op_time_s: Optional[Mapping[str, float]] = None,
    measure_scratch: bool = False,
    count_loops: bool = False,
    sample_inputs: Any = None,
) -> StepAnalysis:
    """Analyze the training step `function` (a ConcreteFunction, or any target `capture.from_tf` takes).

    op_time_s: measured seconds per node (`edge.op_trace.OpTrace.seconds`); static costs otherwise.
    measure_scratch: probe kernels' scratch memory on the measuring device.
    count_loops: for a ConcreteFunction `function`, run its while loops whose trip count depends on data
    on `sample_inputs` (its arguments; synthetic ones, `measure.inputs_like`, when None) to count their
    iterations (`seqmem.runtime.trip_counts`); without, those loops' lists are unsized.
    The analysis lists the loop accumulators a plan may swap (`seqmem.edge.loop_swap`).
    """
    trip_counts = _trip_counts(function, sample_inputs) if count_loops else {}
    with gc_paused():  # capture builds many objects around a large graph
        graph = capture.from_tf(function, trip_counts=trip_counts)
    in_use_before = _in_use_bytes()  # after the capture, whose tracing may create variables (optimizer slots)
    measured = None
    if measure_scratch:
        from seqmem.runtime.scratch_probe import measure_scratch_bytes

        measured = measure_scratch_bytes(graph)
    swaps, held_by_bodies, iterations, calls, pinned_branches = _loops_and_calls(graph)
    analysis = analyze_graph(graph, loss=loss, machine=machine, op_time_s=op_time_s, measured_scratch_bytes=measured,
                             inter_op_threads=inter_op_threads(), loop_swaps=swaps, body_bytes=held_by_bodies,
                             iterations=iterations, calls=calls)
    return dataclasses.replace(analysis, arena_reserved=device.arena_reserved(), in_use_before_bytes=in_use_before,
                               default_device=device.memory_device(), pinned_branch_bytes=pinned_branches)


def _trip_counts(function: Any, sample_inputs: Any) -> dict[str, int]:
    """`measured_trip_counts` of `function`'s data-dependent loops, on `sample_inputs` or, where there are
    such loops, on synthetic inputs made here (freed before the analysis reads what the device holds)."""
    if not isinstance(function, capture.ConcreteFunction):
        return {}
    loops = list_sizes.unbounded_loops(function)
    if not loops:
        return {}
    if sample_inputs is None:
        sample_inputs = inputs_like(function.structured_input_signature[0])
    return measured_trip_counts(function, loops, sample_inputs)


def _in_use_bytes() -> dict[str, int]:
    """Bytes in use now on the measuring device, under the simulator's name for the default device, "",
    where a captured step's ops run unless placed: the measuring device is TensorFlow's default one (a GPU
    when there is one). {} where nothing can be measured."""
    try:
        return {"": device.memory_stats().current_bytes}
    except RuntimeError:  # a CPU that is not the emulated device: no arena to read
        return {}


def _loops_and_calls(graph: Graph) -> tuple[list[LoopSwap], dict[str, int], dict[str, Iteration],
                                           dict[str, CallCharge], dict[str, int]]:
    """The step's swappable loop accumulators, the bytes each of its loops' and calls' bodies holds, its
    loops' iterations, the charges of its calls that free arguments (`edge.bodies.body_memory`), and its
    own conditionals' charges where a pinned step's branches hold other bytes
    (`StepAnalysis.pinned_branch_bytes`)."""
    if not any(node.op in FUNCTIONAL_OPS for node in graph.nodes.values()):
        return [], {}, {}, {}, {}
    graph_def = capture.to_graph_def(graph)
    return (loop_accumulators(graph_def), *body_memory(graph_def, handed_over(graph), variable_shapes(graph)))


def inter_op_threads() -> int:
    """Ops TensorFlow's executor may run at once in this process (its inter-op pool, at least 1)."""
    threads = tf.config.threading.get_inter_op_parallelism_threads()
    return threads if threads > 0 else max(1, os.cpu_count() or 1)


def predicted_peak_bytes(function: Any, *, measure_scratch: bool = False) -> int:
    """seqmem's predicted peak device bytes (BFC allocator model) of one call of the unoptimized `function`.

    measure_scratch: probe kernels' scratch memory on the measuring device, as `optimize` does.
    """
    analysis = analyze_function(function, measure_scratch=measure_scratch)
    return simulate(analysis.graph, analysis.order, allocator="bfc", **analysis.simulator_options()).peak_bytes


def with_blocked_heads(analysis: StepAnalysis, budget_bytes: int, machine: MachineModel
                       ) -> tuple[Optional[StepAnalysis], tuple[BlockedHead, ...], tuple[str, ...]]:
    """The analysis of `analysis`'s step with each vocabulary head it has (`seqmem.rewrite.vocabulary_head`)
    replaced by its blocked computation, in row blocks whose logits take at most 1/64 of `budget_bytes`
    each; the heads replaced; and one line for each cross-entropy of the step that is not a recognized head,
    saying why. (None, (), lines) where the step has no head. The replaced step's nodes keep their measured
    times and scratch; the new ones are costed statically (`machine`).
    """
    search = find_heads(analysis.graph, analysis.anatomy.backward)
    notes = tuple(f"vocabulary head not blocked: {reason}" for reason in search.unrecognized)
    if not search.heads:
        return None, (), notes
    graph, heads = analysis.graph, []
    for number, head in enumerate(search.heads):
        blocks = min(head.rows, math.ceil(head.logits_bytes / (budget_bytes * _BLOCK_SHARE_OF_BUDGET)))
        graph = blocked_head(graph, head, blocks, f"seqmem_head/{number}")
        heads.append(BlockedHead(head.loss, head.rows, head.hidden, head.vocabulary, blocks, head.logits_bytes,
                                 analysis.timing.cost_s.get(head.projection, 0.0)))
    blocked = analyze_graph(graph, loss=analysis.anatomy.losses, machine=machine, op_time_s=analysis.timing.cost_s,
                            measured_scratch_bytes=analysis.scratch_bytes, inter_op_threads=inter_op_threads(),
                            loop_swaps=analysis.loop_swaps, iterations=analysis.iterations)
    blocked = dataclasses.replace(blocked, arena_reserved=analysis.arena_reserved,
                                  in_use_before_bytes=analysis.in_use_before_bytes,
                                  default_device=analysis.default_device)
    return blocked, tuple(heads), notes
