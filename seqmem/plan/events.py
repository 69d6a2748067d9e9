"""A plan as the simulator sees it: swap events on the step's schedule, and the simulated trace of a plan or
of the unoptimized step (`Baseline`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from seqmem.analyze.analysis import StepAnalysis
from seqmem.errors import SimulatedOutOfMemoryError
from seqmem.ir.graph import Graph
from seqmem.plan.readers import last_early_reader
from seqmem.sim.simulator import simulate
from seqmem.sim.trace import MemoryTrace, SwapEvent
from seqmem.decisions.plan import Decision, Plan

__all__ = ["Baseline", "restore_bytes", "simulate_baseline", "simulate_events", "swap_events"]



@dataclass(frozen=True)
class Baseline:
    """The unoptimized step, simulated once: its trace, and whether the allocator
    model placed every buffer within the arena (always True without an arena)."""

    trace: MemoryTrace
    placed: bool

    def fits(self, target_bytes: int) -> bool:
        return self.trace.peak_bytes <= target_bytes and self.placed


def simulate_events(analysis: StepAnalysis, events, allocator: str, arena_bytes: Optional[int]) -> tuple[MemoryTrace, bool]:
    """The simulated trace, and whether the allocator model placed every buffer within `arena_bytes`."""
    limit = arena_bytes if allocator == "bfc" else None
    arguments = (analysis.graph, analysis.order, events)
    model = {"allocator": allocator, **analysis.simulator_options()}
    try:
        return simulate(*arguments, limit_bytes=limit, **model), True
    except SimulatedOutOfMemoryError:
        return simulate(*arguments, **model), False


def simulate_baseline(analysis: StepAnalysis, *, allocator: str = "bfc", arena_bytes: Optional[int] = None) -> Baseline:
    """Simulate the unoptimized step once, for any number of `choose_conservations` calls."""
    return Baseline(*simulate_events(analysis, (), allocator, arena_bytes))



def swap_events(plan: Plan, analysis: StepAnalysis) -> list[SwapEvent]:
    """The simulator's view of `plan` on the analysis's schedule."""
    graph, order = analysis.graph, analysis.order
    position = {name: i for i, name in enumerate(order)}
    events = []
    for decision in plan.decisions:
        out_after = last_early_reader(graph, decision.tensor, decision.consumers, position)
        in_before = decision.consumers[0] if decision.in_branch else order[position[decision.trigger] + 1]
        events.append(SwapEvent(decision.tensor, out_after, in_before,
                                resident_bytes=decision.resident_bytes, restore_bytes=restore_bytes(graph, decision),
                                handle_bytes=decision.handle_bytes, in_branch=decision.in_branch))
    return events



def restore_bytes(graph: Graph, decision: Decision) -> int:
    """Transient device bytes restoring `decision`'s tensor needs besides the copy (`Kind.restore_bytes`)."""
    return decision.kind.restore_bytes(decision.size_bytes, graph)
