"""Refining the order a pinned step runs in around the peak of a plan (`seqmem.sim.reorder.refine_order`)."""

from __future__ import annotations

import dataclasses

from seqmem.analyze.analysis import StepAnalysis
from seqmem.plan.events import simulate_events, swap_events
from seqmem.sim.reorder import refine_order
from seqmem.sim.schedule import executor_order, pinned_nodes
from seqmem.sim.trace import MemoryTrace
from seqmem.decisions.plan import Plan
from seqmem.plan.triggers import TriggerIndex

__all__ = ["refined_pinned_order"]


def refined_pinned_order(analysis: StepAnalysis, plan: Plan, allocator: str = "bfc") -> tuple[str, ...]:
    """An order to pin `analysis`'s step to under which `plan`'s conservations peak lower than in
    `plan.pinned_order` (`sim.reorder.refine_order`; that order itself when no move lowers it). In each
    candidate order every restore comes right after the last backward node before its first reader (a late
    restore, `plan.candidates._restore_timings`); plan again on the order returned.
    Raises ValueError for a plan that is not pinned or that swaps loop accumulators."""
    if not plan.pinned_order or plan.loop_swaps:
        raise ValueError("only a pinned plan without loop swaps can have its order refined")
    graph, timing = analysis.graph, analysis.timing

    def realize(order: tuple[str, ...]) -> tuple[str, ...]:
        return executor_order(graph, timing.cost_s, chain=pinned_nodes(graph, order))

    def trace_of(order: tuple[str, ...]) -> MemoryTrace:
        candidate = dataclasses.replace(analysis, order=order)
        triggers = TriggerIndex(graph, timing, analysis.anatomy.backward, {name: i for i, name in enumerate(order)})
        decisions = []
        for decision in plan.decisions:
            trigger = triggers.last_before(decision.consumers)
            if trigger is None:
                raise ValueError(f"no backward node runs before {decision.tensor}'s readers")
            decisions.append(dataclasses.replace(decision, trigger=trigger))
        events = swap_events(dataclasses.replace(plan, decisions=tuple(decisions)), candidate)
        return simulate_events(candidate, events, allocator, None)[0]

    return refine_order(graph, plan.pinned_order, frozenset(pinned_nodes(graph, plan.pinned_order)), realize,
                        trace_of)
