"""Planning: which tensors to conserve, and how, so that a step's predicted peak fits a target. Free of
TensorFlow.

`search.plan_swaps` is the entry point: loop accumulators first (`loop_choice`), then the candidates
(`candidates`) by the selector (`search`), each plan simulated as swap events (`events`); `refine` reorders a
pinned step around a plan's peak.
"""

from seqmem.plan.events import Baseline, simulate_baseline, swap_events
from seqmem.plan.loop_choice import loop_swapped
from seqmem.plan.refine import refined_pinned_order
from seqmem.plan.search import plan_swaps

__all__ = ["Baseline", "loop_swapped", "plan_swaps", "refined_pinned_order", "simulate_baseline", "swap_events"]
