"""The budget-driven selector (after Meng et al.; conservation kinds after Janssen et al.).

Loops first (`seqmem.plan.loop_choice`). Then the candidates
(`seqmem.plan.candidates`), in order: each is added by the cheapest kind that
frees enough at the current peak (else the one that frees most), while it
lowers the predicted peak, until the peak fits the target. A tensor that a
chosen recomputation reads stays on the device.

The peak is tracked incrementally: conserving a tensor removes its bytes from
the live tensor bytes between its last early reader and its restore, a range
update on a max segment tree (O(log n) per candidate). The allocator's
fragmentation is then checked by one full simulation with the BFC model; if
that still exceeds the target, selection continues with a lower target.
Persistent memory (weights, optimizer slots, inputs) counts against the budget.

Two searches where the first does not reach its target: the search adds
candidates by the cheapest kind that frees enough at the current peak, so when
the target is out of its reach it can end above the plan that conserves every
candidate by the kind that frees most; a second search for a target no plan
reaches finds that plan, the lowest there is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from seqmem.analyze.analysis import StepAnalysis
from seqmem.analyze.critical_path import MachineModel
from seqmem.errors import ArenaFragmentationError, InfeasibleBudgetError
from seqmem.gc_pause import without_gc
from seqmem.ir.graph import TensorRef
from seqmem.plan.candidates import Candidate, Option, conservation_candidates
from seqmem.plan.events import Baseline, simulate_baseline, simulate_events, swap_events
from seqmem.plan.floor import Floor, floor_of
from seqmem.plan.host_room import HostRoom
from seqmem.plan.loop_choice import choose_loop_swaps, loop_swap_fields
from seqmem.plan.segment_tree import MaxTree
from seqmem.sim.trace import MemoryTrace
from seqmem.decisions.plan import ConservationOptions, LoopSwap, SkippedCandidate, Plan
from seqmem.units import MIB

__all__ = ["PlanResult", "cheapest_helpful", "choose_conservations"]

_MAX_ROUNDS = 64
_FLOOR_TARGET_BYTES = 1  # a target no plan reaches: the search conserves every candidate by the kind that frees most


@dataclass(frozen=True)
class PlanResult:
    """What planning for a target found.

    plan: the plan that fits the target (`fits`); where none does, the lowest-peak plan the search made
    (None where the allocator model placed none in the arena: `fragmented`). smallest_peak_bytes: that
    plan's predicted peak (where fragmented, the peak of the plan whose bytes fit but whose buffers the
    model could not place). reason: why no plan fits, with what to do ("" when one does). floor: what
    the lowest plan's peak is made of, where no plan fits and the model placed its buffers (None otherwise).
    """

    plan: Optional[Plan]
    fits: bool
    smallest_peak_bytes: int
    fragmented: bool = False
    reason: str = ""
    floor: Optional[Floor] = None

    def fitting_plan(self) -> Plan:
        """The plan, where it fits. Raises `error()` where none does."""
        if not self.fits:
            raise self.error()
        return self.plan

    def error(self) -> InfeasibleBudgetError:
        """What to raise where no plan fits: InfeasibleBudgetError with the reason and the smallest peak
        (ArenaFragmentationError where only the allocator model's fragmentation stood in the way)."""
        error = ArenaFragmentationError if self.fragmented else InfeasibleBudgetError
        return error(self.reason, smallest_peak_bytes=self.smallest_peak_bytes, floor=self.floor)


@without_gc
def choose_conservations(
    analysis: StepAnalysis,
    budget_bytes: int,
    *,
    target_bytes: Optional[int] = None,
    baseline: Optional[Baseline] = None,
    machine: MachineModel = MachineModel(),
    options: ConservationOptions = ConservationOptions(),
    allocator: str = "bfc",
    arena_bytes: Optional[int] = None,
    pinned: bool = False,
    loop_swap_depth: Optional[int] = None,
) -> PlanResult:
    """Choose the tensors to conserve (swap, recompute, compress: `options`), and how, so that the step's
    predicted peak fits `target_bytes`.

    budget_bytes: the caller's budget, recorded in the plan (a plan is
    `feasible` when its predicted peak fits it). target_bytes: the peak to plan
    for (default: the budget itself); `optimize` plans below the budget by its
    safety margin, and its calibration may aim at the smallest achievable peak
    even when that is over the budget, to let the device decide. baseline: the unoptimized step's
    simulation under the same `allocator`, `arena_bytes` and pinning, when the
    caller already has it (calibration plans several times).
    arena_bytes: the device arena's size, when known (the emulated device's
    limit): a plan whose buffers the allocator model cannot place in it, for
    fragmentation, does not fit either.
    pinned: plan for the step pinned to its schedule (`StepAnalysis.pinned`);
    the plan records that order, and the rewrite pins it even without swaps.
    loop_swap_depth: swap the analysis's loop accumulators (`StepAnalysis.loop_swaps`)
    where that helps, with loops bounded to this many iterations at once
    (recorded as the plan's `loop_parallel_iterations`); None: no loop swaps.
    Returns a plan without decisions when the step already fits; where no plan fits, the lowest-peak one
    and the reason, naming the smallest achievable peak and the op that sets it (`PlanResult`). Raises
    ValueError for a target that is not positive.
    """
    target_bytes = budget_bytes if target_bytes is None else target_bytes
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    if pinned:
        analysis = analysis.pinned()
    if baseline is None:
        baseline = simulate_baseline(analysis, allocator=allocator, arena_bytes=arena_bytes)
    before = baseline.trace
    pinned_order = analysis.order if pinned else ()
    if baseline.fits(target_bytes):
        fits = "fits once pinned to its schedule: no swaps" if pinned else "already fits the budget: no swaps"
        plan = Plan(budget_bytes, target_bytes, before.peak_bytes, before.peak_bytes,
                    notes=(f"the step {fits}",), pinned_order=pinned_order, options=options)
        return PlanResult(plan, True, plan.predicted_peak_after_bytes)

    search = _Search(analysis, baseline, budget_bytes, pinned_order, machine, options, allocator, arena_bytes,
                     loop_swap_depth)
    result = search.run(target_bytes)
    if not result.fits and target_bytes > _FLOOR_TARGET_BYTES:
        floor = search.run(_FLOOR_TARGET_BYTES)  # the most-conserving plan (see the module's docstring)
        if floor.lowest_peak_bytes <= target_bytes and floor.lowest_placed:
            plan = dataclasses.replace(floor.lowest_plan, target_bytes=target_bytes, notes=floor.lowest_plan.notes + (
                "the most-conserving plan: the search at the target ended above it",))
            return PlanResult(plan, True, plan.predicted_peak_after_bytes)
        if floor.lowest_peak_bytes < result.lowest_peak_bytes:
            result = dataclasses.replace(result, lowest_plan=floor.lowest_plan, lowest_trace=floor.lowest_trace,
                                         searched=floor.searched)
    if result.fits:
        return PlanResult(result.plan, True, result.plan.predicted_peak_after_bytes)
    planned_for = f"budget was {budget_bytes / MIB:.1f} MB (planned for {target_bytes / MIB:.1f} MB)"
    if result.host_refused:
        planned_for += f", swaps limited to {options.max_host_bytes / MIB:.1f} MB of host memory"
    if result.plan.predicted_peak_after_bytes <= target_bytes:  # the bytes fit; the buffers were not placed
        peak = result.plan.predicted_peak_after_bytes
        return PlanResult(None, False, peak, fragmented=True, reason=(
            f"the allocator model cannot place the step's buffers in the {arena_bytes / MIB:.1f} MB arena even "
            f"with {len(result.plan.decisions)} swaps (fragmentation; predicted peak {peak / MIB:.1f} MB); "
            f"{planned_for}. Raise the budget or reduce the batch size."))
    lowest = result.lowest_floor()
    return PlanResult(result.lowest_plan, False, result.lowest_peak_bytes, floor=lowest, reason=(
        f"smallest achievable peak is {result.lowest_peak_bytes / MIB:.1f} MB ({lowest.op_type} {lowest.op!r}; "
        f"{lowest.describe()}); {planned_for}. Raise the budget or reduce the batch size."))


@dataclass(frozen=True)
class _SearchResult:
    """Where one search for a target ended (`plan`: its last plan, which `fits` the target when it is
    `placed` in the arena too) and the lowest-peak plan it tried (more swaps can raise a peak), with its
    simulation (`lowest_trace`) of the analysis the search planned on (`searched`: with its loop swaps)."""

    plan: Plan
    fits: bool
    placed: bool
    lowest_plan: Plan
    lowest_placed: bool
    lowest_trace: MemoryTrace
    searched: StepAnalysis
    host_refused: bool

    @property
    def lowest_peak_bytes(self) -> int:
        return self.lowest_plan.predicted_peak_after_bytes

    def lowest_floor(self) -> Floor:
        """What the lowest plan's peak is made of (computed where no plan fits, not on every search)."""
        return floor_of(self.searched, self.lowest_trace, self.lowest_plan)


@dataclass(frozen=True)
class _Search:
    """`choose_conservations`' selection for one step, run for a target."""

    analysis: StepAnalysis
    baseline: Baseline
    budget_bytes: int
    pinned_order: tuple
    machine: MachineModel
    options: ConservationOptions
    allocator: str
    arena_bytes: Optional[int]
    loop_swap_depth: Optional[int]

    def run(self, target_bytes: int) -> _SearchResult:
        analysis, baseline, budget_bytes, options = self.analysis, self.baseline, self.budget_bytes, self.options
        machine, allocator, arena_bytes, pinned_order = self.machine, self.allocator, self.arena_bytes, self.pinned_order
        before, order = baseline.trace, analysis.order
        host = HostRoom(math.inf if options.max_host_bytes is None else options.max_host_bytes)
        loop_swaps: tuple[LoopSwap, ...] = ()
        if self.loop_swap_depth is not None and analysis.loop_swaps:
            loop_swaps, analysis, baseline = choose_loop_swaps(analysis, baseline, target_bytes, self.loop_swap_depth,
                                                                allocator, arena_bytes, host)
        loop_fields = loop_swap_fields(loop_swaps, self.loop_swap_depth, self.analysis.graph, machine)
        start = baseline.trace
        if baseline.fits(target_bytes):
            plan = Plan(budget_bytes, target_bytes, before.peak_bytes, start.peak_bytes,
                        pinned_order=pinned_order, options=options, **loop_fields,
                        notes=("the step fits with its loops' accumulators swapped: no other swaps",))
            return _SearchResult(plan, True, True, plan, True, start, analysis, host.refused)

        device = start.busiest()
        tree = MaxTree(device.tensor_live_bytes)
        position = {name: i for i, name in enumerate(order)}
        candidates, skipped = conservation_candidates(analysis, start, machine, options, position,
                                          {swap.tensor for swap in loop_swaps})

        chosen: dict[TensorRef, tuple[Candidate, Option]] = {}
        limit = options.max_decisions
        live_target = target_bytes - (device.peak_bytes - device.tensor_peak_bytes)  # leave room for fragmentation
        after, placed = start, baseline.placed
        lowest, lowest_chosen, lowest_placed = start, {}, placed
        forced = 1
        for _ in range(_MAX_ROUNDS):
            changed = _select(candidates, chosen, tree, live_target - device.tensor_persistent_bytes, limit, host)
            plan = _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, options)
            after, placed = simulate_events(analysis, swap_events(plan, analysis), allocator, arena_bytes)
            if after.peak_bytes < lowest.peak_bytes:
                lowest, lowest_chosen, lowest_placed = after, dict(chosen), placed
            if (after.peak_bytes <= target_bytes and placed) or len(chosen) == len(candidates) \
                    or (limit is not None and len(chosen) >= limit):
                break
            if after.peak_bytes <= target_bytes or not changed:
                # The bytes fit but the arena's regions do not hold the buffers, or no candidate live at the
                # exact model's peak is left while the allocator model's peak is still over: swap the next
                # longest-lived candidates wherever they are live, to thin out large buffers (twice as
                # many each time this repeats).
                left = [c for c in candidates if c.tensor not in chosen and not _needed_by_recomputation(c.tensor, chosen)]
                room = len(left) if limit is None else limit - len(chosen)
                for candidate in left[:min(forced, room)]:
                    option = cheapest_helpful(candidate, -1, candidate.options[0].decision.size_bytes, chosen, host)
                    if option is not None:
                        _choose(tree, candidate, option, chosen, host)
                forced *= 2
            else:
                forced = 1
            if after.peak_bytes > target_bytes:
                live_target -= max(after.peak_bytes - target_bytes, target_bytes // 20)

        def finished(target: int, decisions: Mapping, peak_bytes: int) -> Plan:
            plan = _plan(budget_bytes, target, before, decisions, skipped, candidates, options, peak_bytes,
                         target_bytes)
            return dataclasses.replace(plan, pinned_order=pinned_order, **{
                **loop_fields, "predicted_overhead_s": plan.predicted_overhead_s + loop_fields["predicted_overhead_s"]})

        return _SearchResult(
            plan=finished(target_bytes, chosen, after.peak_bytes),
            fits=after.peak_bytes <= target_bytes and placed,
            placed=placed,
            lowest_plan=finished(lowest.peak_bytes, lowest_chosen, lowest.peak_bytes),
            lowest_placed=lowest_placed,
            lowest_trace=lowest,
            searched=analysis,
            host_refused=host.refused,
        )


def _select(candidates: Sequence[Candidate], chosen: dict, tree: MaxTree, target_live_bytes: int,
            max_decisions: Optional[int], host: HostRoom) -> int:
    """Add candidates (in order), each by the cheapest kind that helps the current peak and fits the host's
    room, until the peak <= target or `max_decisions` are chosen; a chosen candidate whose restored copy is
    live at the peak moves to a later restore that is not, when it has one. Returns how many were added or
    moved (each move is to a strictly later restore, so this ends)."""
    changed = 0
    progress = True
    while tree.max() > target_live_bytes and progress:
        progress = False
        for candidate in candidates:
            current = chosen.get(candidate.tensor)
            if tree.max() <= target_live_bytes or (current is None and max_decisions is not None
                                                   and len(chosen) >= max_decisions):
                return changed
            peak = tree.argmax()
            if _needed_by_recomputation(candidate.tensor, chosen) or not candidate.out_pos < peak \
                    or (current is not None and peak < current[1].off_until):
                continue
            if current is not None:
                _unchoose(tree, candidate, current[1], chosen, host)
            option = cheapest_helpful(candidate, peak, tree.max() - target_live_bytes, chosen, host)
            if option is None:
                if current is not None:
                    _choose(tree, candidate, current[1], chosen, host)
                continue
            _choose(tree, candidate, option, chosen, host)
            changed += 1
            progress = True
    return changed


def cheapest_helpful(candidate: Candidate, peak: int, needed_bytes: int, chosen: Mapping,
                      host: HostRoom) -> Option | None:
    """Of the options that free the tensor at position `peak` and fit the host's room: the cheapest that
    frees `needed_bytes`, else the one that frees most (the cheapest of those); None if none helps."""
    helpful = [option for option in candidate.options
               if peak < option.off_until and option.decision.saved_bytes > 0 and not option.reads & chosen.keys()
               and host.admits(option.decision.host_bytes)]
    enough = [option for option in helpful if option.decision.saved_bytes >= needed_bytes]
    if enough:
        return min(enough, key=lambda option: (option.decision.cost_s, -option.decision.saved_bytes))
    return min(helpful, key=lambda option: (-option.decision.saved_bytes, option.decision.cost_s), default=None)


def _needed_by_recomputation(ref: TensorRef, chosen: Mapping) -> bool:
    return any(ref in option.reads for _, option in chosen.values())


def _choose(tree: MaxTree, candidate: Candidate, option: Option, chosen: dict, host: HostRoom) -> None:
    decision = option.decision
    host.left -= decision.host_bytes
    tree.add(candidate.out_pos + 1, option.off_until, -decision.saved_bytes)
    tree.add(option.in_pos, option.in_pos + 1, option.restore_bytes + decision.resident_bytes)
    chosen[candidate.tensor] = (candidate, option)


def _unchoose(tree: MaxTree, candidate: Candidate, option: Option, chosen: dict, host: HostRoom) -> None:
    """Undo `_choose`."""
    decision = option.decision
    host.left += decision.host_bytes
    tree.add(candidate.out_pos + 1, option.off_until, decision.saved_bytes)
    tree.add(option.in_pos, option.in_pos + 1, -(option.restore_bytes + decision.resident_bytes))
    del chosen[candidate.tensor]


def _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, options, peak_after=None,
          search_target_bytes=None) -> Plan:
    """The plan of the `chosen` candidates; the others listed as skipped, "not needed" where the peak fits
    the target the search ran for (`search_target_bytes`, default `target_bytes`)."""
    search_target_bytes = target_bytes if search_target_bytes is None else search_target_bytes
    decisions = tuple(chosen[c.tensor][1].decision for c in candidates if c.tensor in chosen)
    peak = before.peak_bytes if peak_after is None else peak_after
    why = "not needed: the peak fit without it" if peak <= search_target_bytes else "the search stopped without it"
    unused = tuple(SkippedCandidate(c.tensor, c.options[0].decision.size_bytes, why)
                   for c in candidates if c.tensor not in chosen)
    return Plan(
        budget_bytes=budget_bytes,
        target_bytes=target_bytes,
        predicted_peak_before_bytes=before.peak_bytes,
        predicted_peak_after_bytes=peak,
        decisions=decisions,
        skipped=tuple(skipped) + unused,
        predicted_overhead_s=sum(d.cost_s for d in decisions),
        options=options,
    )
