"""Planning: which tensors to conserve, and how, so that a step's predicted peak fits a target. Free of
TensorFlow.

`choose_conservations` is the entry point, and returns a value (`PlanResult`: the plan, whether it fits, why
not): loop accumulators first (`loop_choice`), then the candidates (`candidates`) by the selector (`search`),
each plan simulated as swap events (`events`); `refine` reorders a pinned step around a plan's peak.
"""

from seqmem.plan.events import Baseline, simulate_baseline, swap_events
from seqmem.plan.loop_choice import loop_swapped
from seqmem.plan.refine import refined_pinned_order
from seqmem.plan.search import PlanResult, choose_conservations

__all__ = ["Baseline", "PlanResult", "choose_conservations", "loop_swapped", "refined_pinned_order",
           "simulate_baseline", "swap_events"]
