"""A training step's analysis, from its graph: anatomy -> costs -> timing -> schedule -> scratch memory.

Free of TensorFlow: `seqmem.runtime.step_analysis` captures a TensorFlow step
and measures what only a device can tell (op times, kernels' scratch), then
calls `analyze_graph`. The result is plain data; nothing here runs the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from typing import Optional

from seqmem.analyze.anatomy import LossNames, StepAnatomy, analyze_step
from seqmem.analyze.critical_path import MachineModel, Timing, analyze_timing, measured_costs, static_costs
from seqmem.gc_pause import gc_paused
from seqmem.ir.graph import Graph
from seqmem.sim.schedule import executor_order, measured_order, pinned_order, schedule
from seqmem.sim.calls import CallCharge
from seqmem.sim.iteration import Iteration
from seqmem.sim.scratch import static_scratch_bytes, with_concurrent_scratch
from seqmem.ir.backward_views import split_backward_views
from seqmem.ir.barriers import barrier_source, gradient_barriers, split_barriers
from seqmem.ir.merged import merged_duplicates
from seqmem.decisions.plan import LoopSwap, Plan

__all__ = ["StepAnalysis", "analyze_graph", "as_planned", "without_barriers"]


@dataclass(frozen=True)
class StepAnalysis:
    """A training step's graph, its parts, timing, schedule and per-node scratch bytes
    (concurrent ops' scratch included).

    order: the order the step runs in as it is: the executor's, as modelled (`sim.schedule.executor_order`)
    or as seen (`as_ran`). pinned_order: the order it runs
    in on one compute stream once pinned to its deferred ASAP schedule
    (`sim.schedule.deferred_schedule`, `seqmem.rewrite.pin`); empty when it cannot be pinned (TF1 control flow) or
    the executor runs more than one op at a time.
    loop_swaps: the loop accumulators a plan may swap element by element
    (found by `seqmem.edge.loop_swap.loop_accumulators`).
    arena_reserved: the device's arena was reserved up front, not grown (`runtime.device.reserve_arena`);
    the BFC allocator model follows it.
    in_use_before_bytes: bytes measured in use on the measuring device (under the simulator's device name:
    "" for the default device) when the step was analyzed, before it first ran; the simulator counts them
    in place of its own chunks for the variables and inputs (`sim.simulator.simulate`). Empty where
    nothing was measured.
    calls: the `CallCharge` of each function call whose body frees arguments (`edge.bodies.body_memory`),
    by node name: its charge in `scratch_bytes` for the arguments' bytes in `graph`, which a plan that
    resizes them (`sim.loop_swaps`) charges again.
    default_device: the device a step's unplaced ops run on ("CPU:0", "GPU:0"; "" where not known): ops
    placed on it by name (`tf.distribute` places a worker's ops on its own device) share the default
    device's memory in the simulator.
    pinned_branch_bytes: by node name, the bytes each of the step's own conditionals is charged with its
    branches run in `edge.bodies.branch_order`, as a pinned step runs them (`edge.pinned_bodies`), where
    that differs from its charge in `scratch_bytes`; `pinned()` charges them.
    """

    graph: Graph
    anatomy: StepAnatomy
    timing: Timing
    order: tuple[str, ...]
    scratch_bytes: Mapping[str, int]
    pinned_order: tuple[str, ...] = ()
    loop_swaps: tuple[LoopSwap, ...] = ()
    arena_reserved: bool = False
    in_use_before_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    iterations: Mapping[str, Iteration] = dataclasses.field(default_factory=dict)
    calls: Mapping[str, CallCharge] = dataclasses.field(default_factory=dict)
    default_device: str = ""
    pinned_branch_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def simulator_options(self) -> dict:
        """The keyword arguments of `sim.simulator.simulate` this analysis fixes: kernels' scratch bytes, the
        arena's mode, the bytes in use before the step, the loops' iterations and the default device."""
        return {"scratch_bytes": self.scratch_bytes, "reserved_arena": self.arena_reserved,
                "in_use_before_bytes": self.in_use_before_bytes, "iterations": self.iterations,
                "default_device": self.default_device}

    def pinned(self) -> "StepAnalysis":
        """This analysis for the step pinned to its schedule: the same, in `pinned_order`, its conditionals
        charged as their pinned branches hold (`pinned_branch_bytes`).
        Raises ValueError when the step cannot be pinned."""
        if not self.pinned_order:
            raise ValueError("this step cannot be pinned: it has TF1 control flow or runs on more than one thread")
        return dataclasses.replace(self, order=self.pinned_order,
                                   scratch_bytes={**self.scratch_bytes, **self.pinned_branch_bytes})

    def as_ran(self, started: Sequence[str]) -> "StepAnalysis":
        """This analysis of the step as it ran on one inter-op thread, to simulate: its graph as TensorFlow
        ran it, the computations Grappler merges merged (`ir.merged.merged_duplicates`), in the order the
        step was seen running in (`started`: node names in the order they started,
        `edge.op_trace.OpTrace.started`; `sim.schedule.measured_order`) instead of the executor model's.
        Not for planning: it has no pinned order, and its anatomy and timing are the graph's as written."""
        graph = merged_duplicates(self.graph)
        return dataclasses.replace(self, graph=graph, order=measured_order(graph, started), pinned_order=())

    def pinning_its_own_order(self) -> "StepAnalysis":
        """This analysis with `pinned_order` set to the order the step runs in as it is: pinning then keeps
        the executor's own order and fixes where swap nodes run in it. Raises ValueError when the step
        cannot be pinned."""
        self.pinned()
        return dataclasses.replace(self, pinned_order=self.order)


def analyze_graph(
    graph: Graph,
    *,
    loss: LossNames = None,
    machine: MachineModel = MachineModel(),
    op_time_s: Optional[Mapping[str, float]] = None,
    measured_scratch_bytes: Optional[Mapping[str, int]] = None,
    inter_op_threads: int = 1,
    loop_swaps: Sequence[LoopSwap] = (),
    body_bytes: Optional[Mapping[str, int]] = None,
    iterations: Optional[Mapping[str, Iteration]] = None,
    calls: Optional[Mapping[str, CallCharge]] = None,
) -> StepAnalysis:
    """Analyze the training step `graph`, each backward reader of a forward view given a view of its own
    (`seqmem.ir.backward_views`; `StepAnalysis.graph` is the graph with them).

    op_time_s: measured seconds per node (static costs from shapes otherwise).
    measured_scratch_bytes: kernels' scratch bytes measured on a device, by node
    name; they replace the static model's estimate for those nodes.
    inter_op_threads: ops the executor may run at once. One (the emulated
    device's one compute stream): nodes run in `executor_order`, or in
    `pinned_order` once pinned. More: in ASAP order, each charged the scratch
    of up to that many - 1 ops overlapping it in time.
    loop_swaps: the step's swappable loop accumulators, recorded as they are.
    body_bytes: bytes the body of each loop (one iteration) and function call holds (`edge.bodies`), by
    node name, charged to the node as scratch.
    iterations: each loop's `Iteration` (`edge.bodies.body_memory`), by node name, which the simulator
    replays through its allocator model.
    calls: the `CallCharge` of each call whose body frees arguments (`edge.bodies.body_memory`), by node name.
    Raises NoBackwardPassError or GraphError as `analyze_step` does.
    """
    with gc_paused():  # pure Python over a possibly large graph
        anatomy = analyze_step(graph, loss)
        split = split_backward_views(graph, anatomy.forward, anatomy.backward)
        if split is not graph:
            graph, anatomy = split, analyze_step(split, anatomy.losses)
        cost_s = static_costs(graph, machine)
        if op_time_s is not None:
            cost_s = measured_costs(graph, op_time_s, cost_s)
        loss_nodes = [ref.node for ref in anatomy.losses]
        timing = analyze_timing(graph, cost_s, loss_nodes)
        scratch = static_scratch_bytes(graph)
        scratch.update(measured_scratch_bytes or {})
        scratch.update(body_bytes or {})
        if inter_op_threads == 1:
            return StepAnalysis(graph, anatomy, timing, executor_order(graph, cost_s), scratch,
                                pinned_order(graph, timing, loss_nodes), tuple(loop_swaps),
                                iterations=dict(iterations or {}), calls=dict(calls or {}))
        scratch = with_concurrent_scratch(scratch, timing, inter_op_threads)
        return StepAnalysis(graph, anatomy, timing, schedule(graph, timing), scratch, loop_swaps=tuple(loop_swaps),
                            iterations=dict(iterations or {}), calls=dict(calls or {}))


def without_barriers(analysis: StepAnalysis) -> Optional[StepAnalysis]:
    """The analysis of `analysis`'s step with its gradient barriers split (`seqmem.ir.barriers`): each
    update may run once its own gradient exists. Same op costs and scratch bytes, one compute stream.
    None when the step has no barrier or cannot be pinned (the split is made for a pinned order)."""
    barriers = gradient_barriers(analysis.graph)
    if not barriers or not analysis.pinned_order:
        return None
    # a custom gradient's loss: its input
    losses = [barrier_source(analysis.graph, ref, barriers) for ref in analysis.anatomy.losses]
    split = analyze_graph(split_barriers(analysis.graph, barriers), loss=losses,
                          op_time_s=analysis.timing.cost_s, measured_scratch_bytes=analysis.scratch_bytes,
                          inter_op_threads=1, loop_swaps=analysis.loop_swaps)
    return dataclasses.replace(split, arena_reserved=analysis.arena_reserved,
                               in_use_before_bytes=analysis.in_use_before_bytes, iterations=analysis.iterations,
                               calls=analysis.calls, default_device=analysis.default_device,
                               pinned_branch_bytes=analysis.pinned_branch_bytes)


def as_planned(analysis: StepAnalysis, plan: Plan) -> StepAnalysis:
    """The analysis of `analysis`'s step as `plan` rewrites it, before its swaps: its gradient barriers split
    where the plan splits them, in the plan's pinned order where it has one."""
    planned = without_barriers(analysis) if plan.split_barriers else analysis
    return dataclasses.replace(planned, order=plan.pinned_order) if plan.pinned_order else planned
