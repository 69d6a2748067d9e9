"""The forms a step may run in, and planning over them (`seqmem.optimize`'s planner).

A step runs as it is or, where the options allow it and the step has one, with its vocabulary heads
blocked (`with_blocked_heads`): one form each. For each form a `FormPlanner` runs `choose_conservations`
at the targets calibration asks for, over the orders the step may run in (pinned to its schedule, to its
own order, to a refined schedule, or as it is), each order's baseline simulated once. `Forms` takes, of
the forms' plans, the one that fits at the lowest predicted overhead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

from seqmem.analyze.analysis import StepAnalysis, without_barriers
from seqmem.analyze.critical_path import MachineModel
from seqmem.edge import capture, loops
from seqmem.plan import Baseline, PlanResult, choose_conservations, refined_pinned_order, simulate_baseline
from seqmem.runtime.step_analysis import with_blocked_heads
from seqmem.ir.barriers import gradient_barriers
from seqmem.decisions.plan import BlockedHead, ConservationOptions, Plan
from seqmem.units import MIB

__all__ = ["Arena", "FormPlanner", "Forms", "forms_of"]

_REFINEMENT_ROUNDS = 3  # refinements of a pinned order, each from the most-conserving plan on the last one


def forms_of(analysis: StepAnalysis, budget_bytes: int, machine: MachineModel, options: ConservationOptions,
             **planner_options) -> "Forms":
    """The forms `analysis`' step may run in: as it is and, where `options` allow blocked heads and the step
    has one, with its vocabulary heads blocked (`with_blocked_heads`); a planner for each."""
    blocked, heads, notes = (with_blocked_heads(analysis, budget_bytes, machine) if options.blocked_head
                             else (None, (), ()))
    forms = [(analysis, ())] + ([(blocked, heads)] if blocked is not None else [])
    return Forms([FormPlanner(form, budget_bytes, machine, options, blocked_heads=form_heads, notes=notes,
                              **planner_options) for form, form_heads in forms])


def _loop_bound(analysis: StepAnalysis, parallel_iterations: Optional[int]) -> Optional[int]:
    """`parallel_iterations` if the step has a loop that may run more iterations at once, else None."""
    if parallel_iterations is None or not loops.loops_above(capture.to_graph_def(analysis.graph), parallel_iterations):
        return None
    return parallel_iterations


@dataclasses.dataclass(frozen=True)
class _Order:
    """A way the step may run: in `analysis`'s order as it is (`pinned` False), or pinned to it."""

    name: str
    analysis: StepAnalysis
    pinned: bool


@dataclasses.dataclass(frozen=True)
class Arena:
    """The arena the allocator model places a plan's buffers in: its size (None: no arena modelled), and,
    once the model placed no plan's buffers in it and planning went on without it, what it said."""

    size_bytes: Optional[int]
    unplaced: Optional[str] = None


class Forms:
    """The planners of a step's forms (`forms_of`), planned as one: each plan is the cheapest form's."""

    def __init__(self, planners: Sequence["FormPlanner"]) -> None:
        self._planners = tuple(planners)
        self.budget_bytes = planners[0].budget_bytes

    def plan(self, target_bytes: int, arena: Arena) -> tuple[PlanResult, Arena]:
        """Of each form's plan for `target_bytes` (`FormPlanner.plan`): the one that fits at the lowest predicted
        overhead (the first form on a tie), else the one with the lowest peak; and the arena it leaves."""
        tried = [planner.plan(target_bytes, arena) for planner in self._planners]
        fitting = [one for one in tried if one[0].fits]
        if fitting:
            return min(fitting, key=lambda one: one[0].plan.predicted_overhead_s)
        return min(tried, key=lambda one: one[0].smallest_peak_bytes)

    def persistent_bytes(self, arena: Arena) -> int:
        """The least any form's `FormPlanner.persistent_bytes` is."""
        return min(planner.persistent_bytes(arena) for planner in self._planners)

    def analysis_of(self, plan: Plan) -> StepAnalysis:
        """The analysis of the form `plan` was made for (the one with its blocked heads)."""
        return next(planner.analysis for planner in self._planners if planner.blocked_heads == plan.blocked_heads)


class FormPlanner:
    """`choose_conservations` for one analysed step at varying targets and arenas, each baseline simulated
    once; the orders it may pin the step to, refined at most once.

    measurable: the device can measure the plans, so a plan that only the
    allocator model's fragmentation rules out is planned without that check.
    pinned: the step gets pinned, to its schedule or to its own order, where a pinned plan fits; a pinned
    step's gradient barriers are split (`seqmem.ir.barriers`), so that each update runs once its own
    gradient exists.
    loop_parallel_iterations: the loop bound every plan carries (see `optimize`).
    loop_swap_depth: `choose_conservations`' (None: no loop swaps).
    blocked_heads: the vocabulary heads `analysis`' step has blocked (`with_blocked_heads`), which every
    plan lists, their cost in its overhead; notes: lines every plan carries.
    """

    def __init__(self, analysis: StepAnalysis, budget_bytes: int, machine: MachineModel, options: ConservationOptions,
                 measurable: bool, pinned: bool, loop_parallel_iterations: Optional[int],
                 loop_swap_depth: Optional[int], blocked_heads: tuple[BlockedHead, ...] = (),
                 notes: tuple[str, ...] = ()) -> None:
        self.analysis, self.budget_bytes = analysis, budget_bytes
        self.blocked_heads, self._notes = blocked_heads, notes
        self._loop_bound = _loop_bound(analysis, loop_parallel_iterations)
        self._options = {"machine": machine, "options": options, "loop_swap_depth": loop_swap_depth}
        self._measurable = measurable
        self._as_it_is = _Order("as it is", analysis, False)
        self._pinned: list[_Order] = []  # a step that does not fit as it is may be pinned
        self._split_barriers: tuple[str, ...] = ()  # of the pinned orders' graph
        if pinned:
            split = without_barriers(analysis)
            if split is not None:
                self._split_barriers = gradient_barriers(analysis.graph)
            pinnable = split or analysis
            self._pinned = [_Order("pinned to its schedule", pinnable, True),
                            _Order("pinned to its own order", pinnable.pinning_its_own_order(), True)]
        self._baselines: dict[tuple[Optional[int], str], Baseline] = {}
        self._refined = False  # whether `_refine` ran

    def persistent_bytes(self, arena: Arena) -> int:
        """Predicted bytes no plan can free: weights, optimizer slots, inputs, constants, and whatever else
        the process held on the device when the step was analyzed (`StepAnalysis.in_use_before_bytes`)."""
        return self._baseline(self._as_it_is, arena.size_bytes).trace.busiest().persistent_bytes

    def plan(self, target_bytes: int, arena: Arena) -> tuple[PlanResult, Arena]:
        """The plan for `target_bytes` in `arena`, ready to run (`PlanResult`), and the arena to plan in from
        then on: where only the allocator model's fragmentation stood in the way and the device can measure
        the plans, planning goes on without the model's arena (calibration checks on the device itself)."""
        result = self._first_fitting(target_bytes, arena.size_bytes)
        if result.fragmented and arena.size_bytes is not None and self._measurable:
            arena = Arena(None, f"the allocator model placed no plan's buffers in the {arena.size_bytes / MIB:.1f} MB "
                                 f"arena (predicted peak {result.smallest_peak_bytes / MIB:.1f} MB)")
            result = self._first_fitting(target_bytes, None)
        if result.plan is not None:
            plan = result.plan
            result = dataclasses.replace(result, plan=dataclasses.replace(
                plan, loop_parallel_iterations=plan.loop_parallel_iterations or self._loop_bound,
                blocked_heads=self.blocked_heads, notes=plan.notes + self._notes,
                predicted_overhead_s=plan.predicted_overhead_s + sum(head.cost_s for head in self.blocked_heads)))
        return result, arena

    def _first_fitting(self, target_bytes: int, arena_bytes: Optional[int]) -> PlanResult:
        """The first plan that fits of: each pinned order, lowest baseline peak first, then as it is (so a
        step that fits as it is is pinned too, to run in the order its peak was predicted for); where none
        does, the pinned order of the lowest result refined around its peak (`_refine`). Else the result
        with the lowest peak."""
        tries = sorted(self._pinned, key=lambda order: self._baseline(order, arena_bytes).trace.peak_bytes)
        results = []
        for order in tries + [self._as_it_is]:
            result = self._plan_in(order, target_bytes, arena_bytes)
            if result.fits:
                return result
            results.append((order, result))
        order, lowest = min(results, key=lambda tried: tried[1].smallest_peak_bytes)
        refined = self._refine(order, lowest.plan, arena_bytes)
        if refined is None:
            return lowest
        again = self._plan_in(refined, target_bytes, arena_bytes)
        return again if again.fits else min(lowest, again, key=lambda result: result.smallest_peak_bytes)

    def _plan_in(self, order: _Order, target_bytes: int, arena_bytes: Optional[int]) -> PlanResult:
        """`choose_conservations` for the step run in `order`."""
        result = choose_conservations(order.analysis, self.budget_bytes, target_bytes=target_bytes,
                                      pinned=order.pinned, baseline=self._baseline(order, arena_bytes),
                                      arena_bytes=arena_bytes, **self._options)
        if result.plan is None:
            return result
        split = self._split_barriers if order.pinned else ()
        return dataclasses.replace(result, plan=dataclasses.replace(result.plan, split_barriers=split))

    def _refine(self, order: _Order, lowest: Optional[Plan], arena_bytes: Optional[int]) -> Optional[_Order]:
        """Once per planner, where copies cannot overlap computation: the pinned `order` refined around the
        peak of its most-conserving plan `lowest` (`plan.refined_pinned_order`), refined again while that
        lowers the most-conserving plan's peak; added to the pinned orders. None where none is lower."""
        if (self._refined or self._options["machine"].copies_overlap or not order.pinned or lowest is None
                or lowest.loop_swaps):
            return None
        self._refined = True
        analysis, refined = order.analysis, None
        for _ in range(_REFINEMENT_ROUNDS):
            candidate = dataclasses.replace(analysis, pinned_order=refined_pinned_order(analysis, lowest))
            if candidate.pinned_order == analysis.pinned_order:
                break
            baseline = simulate_baseline(candidate.pinned(), arena_bytes=arena_bytes)
            plan = choose_conservations(candidate, self.budget_bytes, target_bytes=1, pinned=True, baseline=baseline,
                                        arena_bytes=arena_bytes, **self._options).plan  # the most conserving
            if plan is None or plan.predicted_peak_after_bytes >= lowest.predicted_peak_after_bytes:
                break
            analysis, lowest, refined = candidate, plan, (candidate, baseline)
        if refined is None:
            return None
        order = _Order("pinned to its refined schedule", refined[0], True)
        self._pinned.append(order)
        self._baselines[arena_bytes, order.name] = refined[1]
        return order

    def _baseline(self, order: _Order, arena_bytes: Optional[int]) -> Baseline:
        if (arena_bytes, order.name) not in self._baselines:
            analysis = order.analysis.pinned() if order.pinned else order.analysis
            self._baselines[arena_bytes, order.name] = simulate_baseline(analysis, arena_bytes=arena_bytes)
        return self._baselines[arena_bytes, order.name]
