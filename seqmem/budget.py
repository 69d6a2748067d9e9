"""The budget-driven swap selector (after Meng et al.).

Walk the forward feature maps in reverse topological order by critical-path
distance to the loss (longest-lived first). Skip tensors below a size
threshold, tensors whose backward use follows too soon to hide a transfer, and
tensors that share their buffer with another tensor. Add each remaining one to
the swap set while it lowers the predicted peak, until the peak fits the budget.

The peak is tracked incrementally: a swap removes the tensor's bytes from the
live tensor bytes between its last forward reader and its swap-in, a range
update on a max segment tree (O(log n) per candidate). The allocator's
fragmentation is then checked by one full simulation with the BFC model; if
that still exceeds the budget, selection continues with a lower target.
Persistent memory (weights, optimizer slots, inputs) counts against the budget.

Loops come first: the accumulators a forward while loop fills for its gradient
loop (one element per iteration) can be swapped element by element inside the
loops (`seqmem.edge.loop_swap`). The selector takes whole loops, all their
accumulators together (buffers that alias across iterations go together),
longest-lived first, each while it lowers the predicted peak, and then swaps
feature maps of the step so loop-swapped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from seqmem.analysis import StepAnalysis
from seqmem.anatomy import StepAnatomy
from seqmem.critical_path import MachineModel, transfer_time_s
from seqmem.errors import ArenaFragmentationError, InfeasibleBudgetError, SimulatedOutOfMemoryError
from seqmem.gc_pause import without_gc
from seqmem.ir.graph import Graph, TensorRef
from seqmem.ir.op_tables import SHAPE_OPS
from seqmem.sim.loop_swaps import iterations, with_loop_swaps
from seqmem.sim.simulator import MemoryTrace, SwapEvent, simulate
from seqmem.swap.plan import LoopSwap, SkippedCandidate, SwapDecision, SwapPlan
from seqmem.swap.triggers import TriggerIndex
from seqmem.units import MIB

__all__ = ["Baseline", "loop_swapped", "plan_swaps", "simulate_baseline", "swap_events"]

_MAX_ROUNDS = 64


@dataclass(frozen=True)
class Baseline:
    """The unoptimized step, simulated once: its trace, and whether the allocator
    model placed every buffer within the arena (always True without an arena)."""

    trace: MemoryTrace
    placed: bool

    def fits(self, target_bytes: int) -> bool:
        return self.trace.peak_bytes <= target_bytes and self.placed


def _simulate(analysis: StepAnalysis, events, allocator: str, arena_bytes: Optional[int]) -> tuple[MemoryTrace, bool]:
    """The simulated trace, and whether the allocator model placed every buffer within `arena_bytes`."""
    limit = arena_bytes if allocator == "bfc" else None
    arguments = (analysis.graph, analysis.order, events)
    try:
        return simulate(*arguments, allocator=allocator, scratch_bytes=analysis.scratch_bytes, limit_bytes=limit), True
    except SimulatedOutOfMemoryError:
        return simulate(*arguments, allocator=allocator, scratch_bytes=analysis.scratch_bytes), False


def simulate_baseline(analysis: StepAnalysis, *, allocator: str = "bfc", arena_bytes: Optional[int] = None) -> Baseline:
    """Simulate the unoptimized step once, for any number of `plan_swaps` calls."""
    return Baseline(*_simulate(analysis, (), allocator, arena_bytes))


class _MaxTree:
    """Range add, global max (and where) over a fixed-length integer array."""

    def __init__(self, values: Sequence[int]) -> None:
        size = 1
        while size < max(1, len(values)):
            size *= 2
        self._size = size
        self._max = [float("-inf")] * (2 * size)
        self._add = [0] * (2 * size)
        for i, value in enumerate(values):
            self._max[size + i] = value
        for i in range(size - 1, 0, -1):
            self._max[i] = max(self._max[2 * i], self._max[2 * i + 1])

    def add(self, low: int, high: int, delta: int, node: int = 1, left: int = 0, right: int | None = None) -> None:
        """Add `delta` to positions low..high-1."""
        right = self._size if right is None else right
        if high <= left or right <= low:
            return
        if low <= left and right <= high:
            self._max[node] += delta
            self._add[node] += delta
            return
        middle = (left + right) // 2
        self.add(low, high, delta, 2 * node, left, middle)
        self.add(low, high, delta, 2 * node + 1, middle, right)
        self._max[node] = max(self._max[2 * node], self._max[2 * node + 1]) + self._add[node]

    def max(self) -> int:
        return self._max[1]

    def argmax(self) -> int:
        node = 1
        while node < self._size:
            rest = self._max[node] - self._add[node]
            node = 2 * node if self._max[2 * node] == rest else 2 * node + 1
        return node - self._size


def swap_events(plan: SwapPlan, analysis: StepAnalysis) -> list[SwapEvent]:
    """The simulator's view of `plan` on the analysis's schedule."""
    graph, anatomy, order = analysis.graph, analysis.anatomy, analysis.order
    position = {name: i for i, name in enumerate(order)}
    events = []
    for decision in plan.decisions:
        out_after = _last_forward_reader(graph, decision.tensor, anatomy, position)
        events.append(SwapEvent(decision.tensor, out_after, order[position[decision.trigger] + 1]))
    return events


def _reads_contents_in_backward(graph: Graph, reader: str, anatomy: StepAnatomy) -> bool:
    """Backward readers that need the data (shape-only ops keep reading the original)."""
    return reader in anatomy.backward and graph.node(reader).op not in SHAPE_OPS


def _last_forward_reader(graph: Graph, ref: TensorRef, anatomy: StepAnatomy, position: Mapping[str, int]) -> str:
    readers = [r for r in graph.consumers(ref) if not _reads_contents_in_backward(graph, r, anatomy)]
    return max(readers, key=position.__getitem__) if readers else ref.node


@without_gc
def plan_swaps(
    analysis: StepAnalysis,
    budget_bytes: int,
    *,
    target_bytes: Optional[int] = None,
    baseline: Optional[Baseline] = None,
    machine: MachineModel = MachineModel(),
    min_swap_bytes: int = 64 << 10,
    allocator: str = "bfc",
    arena_bytes: Optional[int] = None,
    pinned: bool = False,
    loop_swap_depth: Optional[int] = None,
) -> SwapPlan:
    """Choose feature maps to swap so that the predicted peak fits `target_bytes`.

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
    Returns a plan without decisions when the step already fits. Raises
    ValueError for a target that is not positive;
    InfeasibleBudgetError, naming the smallest achievable peak and the op that
    sets it, when swapping every candidate is not enough; ArenaFragmentationError
    when the bytes fit but the allocator model cannot place them in the arena.
    pinned: plan for the step pinned to its schedule (`StepAnalysis.pinned`);
    the plan records that order, and the rewrite pins it even without swaps.
    loop_swap_depth: swap the analysis's loop accumulators (`StepAnalysis.loop_swaps`)
    where that helps, with loops bounded to this many iterations at once
    (recorded as the plan's `loop_parallel_iterations`); None: no loop swaps.
    """
    target_bytes = budget_bytes if target_bytes is None else target_bytes
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    if pinned:
        analysis = analysis.pinned()
    graph, anatomy, timing, order = analysis.graph, analysis.anatomy, analysis.timing, analysis.order
    if baseline is None:
        baseline = simulate_baseline(analysis, allocator=allocator, arena_bytes=arena_bytes)
    before = baseline.trace
    pinned_order = analysis.order if pinned else ()
    if baseline.fits(target_bytes):
        fits = "fits once pinned to its schedule: no swaps" if pinned else "already fits the budget: no swaps"
        return SwapPlan(budget_bytes, target_bytes, before.peak_bytes, before.peak_bytes,
                        notes=(f"the step {fits}",), pinned_order=pinned_order)

    loop_swaps: tuple[LoopSwap, ...] = ()
    if loop_swap_depth is not None and analysis.loop_swaps:
        loop_swaps, analysis, baseline = _choose_loop_swaps(analysis, baseline, target_bytes, loop_swap_depth,
                                                            allocator, arena_bytes)
    loop_fields = _loop_fields(loop_swaps, loop_swap_depth, graph, machine)
    graph, start = analysis.graph, baseline.trace
    if baseline.fits(target_bytes):
        return SwapPlan(budget_bytes, target_bytes, before.peak_bytes, start.peak_bytes, pinned_order=pinned_order,
                        notes=("the step fits with its loops' accumulators swapped: no other swaps",), **loop_fields)

    device = start.busiest()
    tree = _MaxTree(device.tensor_live_bytes)
    position = {name: i for i, name in enumerate(order)}
    triggers = TriggerIndex(graph, timing, anatomy.backward)
    candidates, skipped = _candidates(graph, anatomy, timing, start, machine, min_swap_bytes, position, triggers,
                                      {swap.tensor for swap in loop_swaps})

    chosen: dict[TensorRef, tuple[int, int, SwapDecision]] = {}
    live_target = target_bytes - (device.peak_bytes - device.tensor_peak_bytes)  # leave room for fragmentation
    after, placed = start, baseline.placed
    lowest = start  # the lowest peak of the plans tried: more swaps can raise a peak
    forced = 1
    for _ in range(_MAX_ROUNDS):
        added = _select(candidates, chosen, tree, live_target - device.tensor_persistent_bytes)
        plan = _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, timing)
        after, placed = _simulate(analysis, swap_events(plan, analysis), allocator, arena_bytes)
        lowest = min(lowest, after, key=lambda trace: trace.peak_bytes)
        if (after.peak_bytes <= target_bytes and placed) or len(chosen) == len(candidates):
            break
        if after.peak_bytes <= target_bytes or not added:
            # The bytes fit but the arena's regions do not hold the buffers, or no candidate live at the
            # exact model's peak is left while the allocator model's peak is still over: swap the next
            # longest-lived candidates wherever they are live, to thin out large buffers (twice as
            # many each time this repeats).
            for ref, out_pos, in_pos, decision in [c for c in candidates if c[0] not in chosen][:forced]:
                tree.add(out_pos + 1, in_pos, -decision.size_bytes)
                chosen[ref] = (out_pos, in_pos, decision)
            forced *= 2
        else:
            forced = 1
        if after.peak_bytes > target_bytes:
            live_target -= max(after.peak_bytes - target_bytes, target_bytes // 20)
    plan = _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, timing, after.peak_bytes)
    plan = dataclasses.replace(plan, pinned_order=pinned_order, **{
        **loop_fields, "predicted_overhead_s": plan.predicted_overhead_s + loop_fields["predicted_overhead_s"]})
    planned_for = f"budget was {budget_bytes / MIB:.1f} MB (planned for {target_bytes / MIB:.1f} MB)"
    if after.peak_bytes <= target_bytes and not placed:
        raise ArenaFragmentationError(
            f"the allocator model cannot place the step's buffers in the {arena_bytes / MIB:.1f} MB arena even "
            f"with {len(chosen)} swaps (fragmentation; predicted peak {after.peak_bytes / MIB:.1f} MB); "
            f"{planned_for}. Raise the budget or reduce the batch size.",
            smallest_peak_bytes=after.peak_bytes,
        )
    if after.peak_bytes > target_bytes:
        op = graph.node(lowest.order[lowest.busiest().peak_step])
        raise InfeasibleBudgetError(
            f"smallest achievable peak is {lowest.peak_bytes / MIB:.1f} MB ({op.op} {op.name!r}); "
            f"{planned_for}. Raise the budget or reduce the batch size.",
            smallest_peak_bytes=lowest.peak_bytes,
        )
    return plan


def loop_swapped(analysis: StepAnalysis, swaps: Sequence[LoopSwap], depth: int) -> StepAnalysis:
    """The analysis of the step with `swaps` made and loops bounded to `depth` iterations, as the simulator
    sees it (`seqmem.sim.loop_swaps`)."""
    graph, scratch = with_loop_swaps(analysis.graph, analysis.scratch_bytes, swaps, depth)
    return dataclasses.replace(analysis, graph=graph, scratch_bytes=scratch)


def _choose_loop_swaps(analysis: StepAnalysis, baseline: Baseline, target_bytes: int, depth: int, allocator: str,
                       arena_bytes: Optional[int]) -> tuple[tuple[LoopSwap, ...], StepAnalysis, Baseline]:
    """The loop swaps to make (whole forward loops, longest-lived first, each kept when it lowers the
    predicted peak, until the step fits `target_bytes`), the analysis of the step so swapped, its baseline."""
    by_loop: dict[str, list[LoopSwap]] = {}
    for swap in analysis.loop_swaps:
        if swap.element_bytes and analysis.graph.tensor(swap.tensor).size_bytes:
            by_loop.setdefault(swap.forward_loop, []).append(swap)
    distance = analysis.timing.distance_to_loss_s
    position = {name: i for i, name in enumerate(analysis.order)}
    chosen: list[LoopSwap] = []
    current, current_baseline = analysis, baseline
    for loop in sorted(by_loop, key=lambda name: (-distance.get(name, 0.0), position[name])):
        if current_baseline.fits(target_bytes):
            break
        trial = loop_swapped(analysis, chosen + by_loop[loop], depth)
        trial_baseline = simulate_baseline(trial, allocator=allocator, arena_bytes=arena_bytes)
        if trial_baseline.trace.peak_bytes < current_baseline.trace.peak_bytes:
            chosen += by_loop[loop]
            current, current_baseline = trial, trial_baseline
    return tuple(chosen), current, current_baseline


def _loop_fields(loop_swaps: tuple[LoopSwap, ...], depth: Optional[int], graph: Graph, machine: MachineModel) -> dict:
    """The plan's record of `loop_swaps` (sized in the step's unswapped `graph`); each list's bytes cross to the host and back, one element at a
    time and not hidden behind the loop's computation (counted as overhead)."""
    if not loop_swaps:
        return {"predicted_overhead_s": 0.0}
    swapped = sum(swap.element_bytes * iterations(graph, swap) for swap in loop_swaps)
    return {"loop_swaps": loop_swaps, "loop_swapped_bytes": swapped, "loop_parallel_iterations": depth,
            "predicted_overhead_s": 2 * transfer_time_s(swapped, machine)}


def _candidates(graph, anatomy, timing, trace: MemoryTrace, machine, min_swap_bytes, position, triggers,
                loop_swapped: set[TensorRef]):
    """Feature maps worth trying, longest-lived first, as (tensor, out_pos, in_pos, decision); and the skipped."""
    aliases: dict[TensorRef, list[TensorRef]] = {}
    for tensor, owner in trace.buffer_of.items():
        aliases.setdefault(owner, []).append(tensor)
    distance = timing.distance_to_loss_s
    ordered = sorted(anatomy.feature_maps, key=lambda r: (-distance.get(r.node, 0.0), position[r.node], r.index))
    candidates, skipped = [], []
    for ref in ordered:
        size = graph.tensor(ref).size_bytes
        if ref in loop_swapped:
            skipped.append(SkippedCandidate(ref, size or 0, "a loop accumulator swapped element by element"))
            continue
        if size is None or size < min_swap_bytes:
            skipped.append(SkippedCandidate(ref, size or 0, f"smaller than {min_swap_bytes} bytes"))
            continue
        # forward-time aliases only: a backward op writing in place into this buffer would, after the
        # rewrite, write into the swapped-in copy instead
        sharing = [a for a in aliases.get(trace.buffer_of.get(ref), ()) if a != ref and a.node not in anatomy.backward]
        if any(_reads_contents_in_backward(graph, r, anatomy) for a in sharing for r in graph.consumers(a)):
            skipped.append(SkippedCandidate(ref, size, "shares its buffer with another tensor read in backward"))
            continue
        consumers = tuple(sorted(
            (r for r in set(graph.consumers(ref)) if _reads_contents_in_backward(graph, r, anatomy)), key=position.get
        ))
        if not consumers:
            skipped.append(SkippedCandidate(ref, size, "no backward op reads its contents"))
            continue
        transfer = transfer_time_s(size, machine)
        trigger, hidden = triggers.choose(consumers, transfer)
        out_pos = max(position[_last_forward_reader(graph, a, anatomy, position)] for a in [ref, *sharing])
        if trigger is None or position[trigger] + 1 <= out_pos + 1:
            skipped.append(SkippedCandidate(ref, size, "consumed almost immediately: no step between its uses"))
            continue
        if not hidden and timing.start_s[consumers[0]] - timing.completion_s[ref.node] < transfer:
            skipped.append(SkippedCandidate(ref, size, "backward use follows within the transfer time"))
            continue
        decision = SwapDecision(ref, size, consumers, trigger, transfer)
        candidates.append((ref, out_pos, position[trigger] + 1, decision))
    return candidates, skipped


def _select(candidates, chosen, tree: _MaxTree, target_live_bytes: int) -> int:
    """Add candidates (in order) that lower the current peak, until the peak <= target; returns how many."""
    added = 0
    progress = True
    while tree.max() > target_live_bytes and progress:
        progress = False
        for ref, out_pos, in_pos, decision in candidates:
            if tree.max() <= target_live_bytes:
                return added
            if ref in chosen or not out_pos < tree.argmax() < in_pos:
                continue
            tree.add(out_pos + 1, in_pos, -decision.size_bytes)
            chosen[ref] = (out_pos, in_pos, decision)
            added += 1
            progress = True
    return added


def _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, timing, peak_after=None) -> SwapPlan:
    decisions = tuple(chosen[ref][2] for ref, *_ in candidates if ref in chosen)
    unused = tuple(
        SkippedCandidate(ref, d.size_bytes, "not needed: the peak fit without it")
        for ref, _, _, d in candidates if ref not in chosen
    )
    overhead = sum(
        max(0.0, timing.completion_s[d.trigger] + d.transfer_s - timing.start_s[d.consumers[0]]) for d in decisions
    )
    return SwapPlan(
        budget_bytes=budget_bytes,
        target_bytes=target_bytes,
        predicted_peak_before_bytes=before.peak_bytes,
        predicted_peak_after_bytes=before.peak_bytes if peak_after is None else peak_after,
        decisions=decisions,
        skipped=tuple(skipped) + unused,
        predicted_overhead_s=overhead,
    )
