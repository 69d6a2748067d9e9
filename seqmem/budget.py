"""The budget-driven selector (after Meng et al.; conservation kinds after Janssen et al.).

Walk the forward feature maps in reverse topological order by critical-path
distance to the loss (longest-lived first). Skip tensors below a size
threshold or living too briefly (`ConservationOptions`), and tensors that share
their buffer with another tensor. Each remaining one can be conserved by the
kinds allowed that apply to it (a swap whose transfer cannot hide, or a
compression of a non-float32 tensor, does not); add it, by the cheapest kind
that frees enough at the current peak (else the one that frees most), while it
lowers the predicted peak, until the peak fits the budget. A tensor that a
chosen recomputation reads stays on the device. After the feature maps come the
backward tensors that wait on the device for a later reader (`_held_tensors`:
gradients waiting for a join, such as a data-parallel step's all-reduce pack or
a global-norm clip); each can be swapped or compressed between its early and
its late readers the same way.

The peak is tracked incrementally: a swap removes the tensor's bytes from the
live tensor bytes between its last forward reader and its swap-in, a range
update on a max segment tree (O(log n) per candidate). The allocator's
fragmentation is then checked by one full simulation with the BFC model; if
that still exceeds the budget, selection continues with a lower target.
Persistent memory (weights, optimizer slots, inputs) counts against the budget.

Loops come first: the accumulators a forward while loop fills for its gradient
loop (one element per iteration) can be swapped element by element inside the
loops (`seqmem.edge.loop_swap`). The selector takes whole loops, longest-lived
first, each while it lowers the predicted peak; of the loop that makes the step
fit, the fewest accumulators that fit, largest first or smallest first,
whichever swaps fewer bytes (those that save one buffer, across iterations
too, go together). If the step still does not
fit, it then swaps feature maps of the step so loop-swapped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from seqmem.analysis import StepAnalysis
from seqmem.anatomy import StepAnatomy
from seqmem.critical_path import MachineModel, transfer_time_s
from seqmem.errors import ArenaFragmentationError, InfeasibleBudgetError, SimulatedOutOfMemoryError
from seqmem.gc_pause import without_gc
from seqmem.ir.graph import Graph, Node, TensorRef, view_source
from seqmem.ir.op_tables import RECOMPUTABLE_OPS, SHAPE_OPS
from seqmem.sim.loop_swaps import iterations, with_loop_swaps
from seqmem.sim.reorder import refine_order
from seqmem.sim.schedule import executor_order, pinned_nodes
from seqmem.sim.simulator import simulate
from seqmem.sim.trace import MemoryTrace, SwapEvent
from seqmem.swap.plan import HOST_KINDS, LOSSY_KINDS, ConservationOptions, LoopSwap, SkippedCandidate, SwapDecision, SwapPlan
from seqmem.swap.triggers import TriggerIndex
from seqmem.units import MIB

__all__ = ["Baseline", "loop_swapped", "plan_swaps", "refined_pinned_order", "simulate_baseline", "swap_events"]

_MAX_ROUNDS = 64
_FLOOR_TARGET_BYTES = 1  # a target no plan reaches: the search conserves every candidate by the kind that frees most


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
    model = {"allocator": allocator, **analysis.simulator_options()}
    try:
        return simulate(*arguments, limit_bytes=limit, **model), True
    except SimulatedOutOfMemoryError:
        return simulate(*arguments, **model), False


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
    graph, order = analysis.graph, analysis.order
    position = {name: i for i, name in enumerate(order)}
    events = []
    for decision in plan.decisions:
        out_after = _last_early_reader(graph, decision.tensor, decision.consumers, position)
        events.append(SwapEvent(decision.tensor, out_after, order[position[decision.trigger] + 1],
                                resident_bytes=decision.resident_bytes, restore_bytes=_restore_bytes(graph, decision),
                                handle_bytes=decision.handle_bytes))
    return events


def refined_pinned_order(analysis: StepAnalysis, plan: SwapPlan, allocator: str = "bfc") -> tuple[str, ...]:
    """An order to pin `analysis`'s step to under which `plan`'s conservations peak lower than in
    `plan.pinned_order` (`sim.reorder.refine_order`; that order itself when no move lowers it). In each
    candidate order every restore comes right after the last backward node before its first reader (a late
    restore, `_restore_timings`); plan again on the order returned.
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
        return _simulate(candidate, events, allocator, None)[0]

    return refine_order(graph, plan.pinned_order, frozenset(pinned_nodes(graph, plan.pinned_order)), realize,
                        trace_of)


def _restore_bytes(graph: Graph, decision: SwapDecision) -> int:
    """Transient device bytes restoring `decision`'s tensor needs besides the copy: the swapped-in
    compressed copy being cast back, or a recomputed chain's other outputs."""
    if decision.kind == "compress+swap":
        return decision.compressed_bytes
    if decision.kind == "recompute":
        outputs = sum(info.size_bytes or 0 for name in decision.recompute for info in graph.node(name).outputs)
        return max(0, outputs - decision.size_bytes)
    return 0


def _reads_contents_in_backward(graph: Graph, reader: str, anatomy: StepAnatomy) -> bool:
    """Backward readers that need the data (shape-only ops keep reading the original)."""
    return reader in anatomy.backward and graph.node(reader).op not in SHAPE_OPS


def _backward_content_readers(graph: Graph, ref: TensorRef, anatomy: StepAnatomy,
                              position: Mapping[str, int]) -> tuple[str, ...]:
    """`ref`'s readers in backward that need its contents, once each, in the order they run."""
    return tuple(sorted((r for r in set(graph.consumers(ref)) if _reads_contents_in_backward(graph, r, anatomy)),
                        key=position.__getitem__))


def _last_early_reader(graph: Graph, ref: TensorRef, late_readers: Sequence[str], position: Mapping[str, int]) -> str:
    """The last of `ref`'s readers that read the original, not the restored copy (its producer when none)."""
    readers = [r for r in graph.consumers(ref) if r not in late_readers]
    return max(readers, key=position.__getitem__) if readers else ref.node


def _held_tensors(graph: Graph, anatomy: StepAnatomy, trace: MemoryTrace, position: Mapping[str, int]
                  ) -> dict[TensorRef, tuple[str, ...]]:
    """Backward tensors that wait on the device for a later reader, each with its readers after the widest
    gap in the order between its producer and the readers of its contents (the readers it waits for), in
    the order of their producers. A gradient waiting for a join is one: the concatenation a data-parallel
    step's all-reduce packs every gradient into, `clip_by_global_norm`'s scaling after the norm of every
    gradient, a loss-scale optimizer's update after the finite check of every gradient. A gap must hold a
    node (a trigger for the restore). Of tensors sharing one buffer, only the one read last; graph outputs
    (returned to the caller) and tensors in persistent buffers are not held."""
    outputs = set(graph.outputs)
    held: dict[TensorRef, tuple[str, ...]] = {}
    last_read: dict[TensorRef, tuple[int, TensorRef]] = {}  # by buffer: the tensor read last, and when
    for name in sorted(anatomy.backward, key=position.__getitem__):
        node = graph.node(name)
        if node.persistent:
            continue
        for index in range(len(node.outputs)):
            ref = TensorRef(name, index)
            readers = sorted({r for r in graph.consumers(ref) if graph.node(r).op not in SHAPE_OPS},
                             key=position.__getitem__)
            if not readers or ref in outputs:
                continue
            points = [position[name]] + [position[r] for r in readers]
            gap, split = max((points[i + 1] - points[i], -i) for i in range(len(readers)))
            if gap < 2:
                continue
            buffer = trace.buffer_of.get(ref, ref)
            if graph.node(buffer.node).persistent:
                continue
            held[ref] = tuple(readers[-split:])
            if buffer not in last_read or last_read[buffer][0] < points[-1]:
                last_read[buffer] = (points[-1], ref)
    kept = {ref for _, ref in last_read.values()}
    return {ref: readers for ref, readers in held.items() if ref in kept}


@without_gc
def plan_swaps(
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
) -> SwapPlan:
    """Choose feature maps to conserve (swap, recompute, compress: `options`) so that the predicted peak
    fits `target_bytes`.

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
    sets it and holding the plan that reaches it (`smallest_plan`), when
    swapping every candidate is not enough; ArenaFragmentationError when the
    bytes fit but the allocator model cannot place them in the arena.
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
    if baseline is None:
        baseline = simulate_baseline(analysis, allocator=allocator, arena_bytes=arena_bytes)
    before = baseline.trace
    pinned_order = analysis.order if pinned else ()
    if baseline.fits(target_bytes):
        fits = "fits once pinned to its schedule: no swaps" if pinned else "already fits the budget: no swaps"
        return SwapPlan(budget_bytes, target_bytes, before.peak_bytes, before.peak_bytes,
                        notes=(f"the step {fits}",), pinned_order=pinned_order, options=options)

    search = _Search(analysis, baseline, budget_bytes, pinned_order, machine, options, allocator, arena_bytes,
                     loop_swap_depth)
    result = search.run(target_bytes)
    if not result.fits and target_bytes > _FLOOR_TARGET_BYTES:
        # The search adds candidates by the cheapest kind that frees enough at the current peak, so where the
        # target is out of its reach it can end above the plan that conserves every candidate by the kind that
        # frees most.
        floor = search.run(_FLOOR_TARGET_BYTES)
        if floor.lowest_peak_bytes <= target_bytes and floor.lowest_placed:
            return dataclasses.replace(floor.lowest_plan, target_bytes=target_bytes, notes=floor.lowest_plan.notes + (
                "the most-conserving plan: the search at the target ended above it",))
        if floor.lowest_peak_bytes < result.lowest_peak_bytes:
            result = dataclasses.replace(result, lowest_plan=floor.lowest_plan, lowest_op=floor.lowest_op)
    planned_for = f"budget was {budget_bytes / MIB:.1f} MB (planned for {target_bytes / MIB:.1f} MB)"
    if result.host_refused:
        planned_for += f", swaps limited to {options.max_host_bytes / MIB:.1f} MB of host memory"
    if result.plan.predicted_peak_after_bytes <= target_bytes and not result.placed:
        raise ArenaFragmentationError(
            f"the allocator model cannot place the step's buffers in the {arena_bytes / MIB:.1f} MB arena even "
            f"with {len(result.plan.decisions)} swaps (fragmentation; predicted peak "
            f"{result.plan.predicted_peak_after_bytes / MIB:.1f} MB); {planned_for}. Raise the budget or reduce the "
            f"batch size.",
            smallest_peak_bytes=result.plan.predicted_peak_after_bytes,
        )
    if not result.fits:
        op = result.lowest_op
        raise InfeasibleBudgetError(
            f"smallest achievable peak is {result.lowest_peak_bytes / MIB:.1f} MB ({op.op} {op.name!r}); "
            f"{planned_for}. Raise the budget or reduce the batch size.",
            smallest_peak_bytes=result.lowest_peak_bytes,
            smallest_plan=result.lowest_plan,
        )
    return result.plan


@dataclass(frozen=True)
class _SearchResult:
    """Where one search for a target ended (`plan`: its last plan, which `fits` the target when it is
    `placed` in the arena too) and the lowest-peak plan it tried (more swaps can raise a peak)."""

    plan: SwapPlan
    fits: bool
    placed: bool
    lowest_plan: SwapPlan
    lowest_placed: bool
    lowest_op: Optional[Node]
    host_refused: bool

    @property
    def lowest_peak_bytes(self) -> int:
        return self.lowest_plan.predicted_peak_after_bytes


@dataclass(frozen=True)
class _Search:
    """`plan_swaps`' selection for one step, run for a target."""

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
        host = _HostRoom(math.inf if options.max_host_bytes is None else options.max_host_bytes)
        loop_swaps: tuple[LoopSwap, ...] = ()
        if self.loop_swap_depth is not None and analysis.loop_swaps:
            loop_swaps, analysis, baseline = _choose_loop_swaps(analysis, baseline, target_bytes, self.loop_swap_depth,
                                                                allocator, arena_bytes, host)
        loop_fields = _loop_fields(loop_swaps, self.loop_swap_depth, self.analysis.graph, machine)
        graph, start = analysis.graph, baseline.trace
        if baseline.fits(target_bytes):
            plan = SwapPlan(budget_bytes, target_bytes, before.peak_bytes, start.peak_bytes,
                            pinned_order=pinned_order, options=options, **loop_fields,
                            notes=("the step fits with its loops' accumulators swapped: no other swaps",))
            return _SearchResult(plan, True, True, plan, True, None, host.refused)

        device = start.busiest()
        tree = _MaxTree(device.tensor_live_bytes)
        position = {name: i for i, name in enumerate(order)}
        candidates, skipped = _candidates(analysis, start, machine, options, position,
                                          {swap.tensor for swap in loop_swaps})

        chosen: dict[TensorRef, tuple[_Candidate, _Option]] = {}
        limit = options.max_decisions
        live_target = target_bytes - (device.peak_bytes - device.tensor_peak_bytes)  # leave room for fragmentation
        after, placed = start, baseline.placed
        lowest, lowest_chosen, lowest_placed = start, {}, placed
        forced = 1
        for _ in range(_MAX_ROUNDS):
            changed = _select(candidates, chosen, tree, live_target - device.tensor_persistent_bytes, limit, host)
            plan = _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, options)
            after, placed = _simulate(analysis, swap_events(plan, analysis), allocator, arena_bytes)
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
                    option = _cheapest_helpful(candidate, -1, candidate.options[0].decision.size_bytes, chosen, host)
                    if option is not None:
                        _choose(tree, candidate, option, chosen, host)
                forced *= 2
            else:
                forced = 1
            if after.peak_bytes > target_bytes:
                live_target -= max(after.peak_bytes - target_bytes, target_bytes // 20)

        def finished(target: int, decisions: Mapping, peak_bytes: int) -> SwapPlan:
            plan = _plan(budget_bytes, target, before, decisions, skipped, candidates, options, peak_bytes)
            return dataclasses.replace(plan, pinned_order=pinned_order, **{
                **loop_fields, "predicted_overhead_s": plan.predicted_overhead_s + loop_fields["predicted_overhead_s"]})

        return _SearchResult(
            plan=finished(target_bytes, chosen, after.peak_bytes),
            fits=after.peak_bytes <= target_bytes and placed,
            placed=placed,
            lowest_plan=finished(lowest.peak_bytes, lowest_chosen, lowest.peak_bytes),
            lowest_placed=lowest_placed,
            lowest_op=graph.node(lowest.order[lowest.busiest().peak_step]),
            host_refused=host.refused,
        )


def loop_swapped(analysis: StepAnalysis, swaps: Sequence[LoopSwap], depth: int) -> StepAnalysis:
    """The analysis of the step with `swaps` made and loops bounded to `depth` iterations, as the simulator
    sees it (`seqmem.sim.loop_swaps`)."""
    graph, scratch = with_loop_swaps(analysis.graph, analysis.scratch_bytes, swaps, depth)
    return dataclasses.replace(analysis, graph=graph, scratch_bytes=scratch)


def _choose_loop_swaps(analysis: StepAnalysis, baseline: Baseline, target_bytes: int, depth: int, allocator: str,
                       arena_bytes: Optional[int], host: _HostRoom
                       ) -> tuple[tuple[LoopSwap, ...], StepAnalysis, Baseline]:
    """The loop swaps to make, the analysis of the step so swapped, its baseline.

    Forward loops go longest-lived first, each swapped whole when that lowers the predicted peak and its
    lists fit the host's room, until the step fits `target_bytes`. Of the loop whose swap makes it fit,
    only the fewest lists that fit go, largest first or smallest first, whichever swaps fewer bytes (each
    byte swapped costs a serialization and a parse), lists saving one buffer (`LoopSwap.buffer`) together.
    """
    by_loop: dict[str, list[LoopSwap]] = {}
    for swap in analysis.loop_swaps:
        if swap.element_bytes and analysis.graph.tensor(swap.tensor).size_bytes is not None:
            by_loop.setdefault(swap.forward_loop, []).append(swap)
    distance = analysis.timing.distance_to_loss_s
    position = {name: i for i, name in enumerate(analysis.order)}
    chosen: list[LoopSwap] = []
    current, current_baseline = analysis, baseline

    def trial(swaps: list[LoopSwap]) -> tuple[StepAnalysis, Baseline]:
        swapped = loop_swapped(analysis, chosen + swaps, depth)
        return swapped, simulate_baseline(swapped, allocator=allocator, arena_bytes=arena_bytes)

    for loop in sorted(by_loop, key=lambda name: (-distance.get(name, 0.0), position[name])):
        if current_baseline.fits(target_bytes):
            break
        groups = _buffer_groups(analysis.graph, by_loop[loop])
        swaps = [swap for group in groups for swap in group]
        if not swaps or not host.admits(_list_bytes(analysis.graph, swaps)):
            continue
        swapped, swapped_baseline = trial(swaps)
        if swapped_baseline.trace.peak_bytes >= current_baseline.trace.peak_bytes:
            continue
        if swapped_baseline.fits(target_bytes):  # of the two orders' fewest groups that fit, fewer bytes
            fitting = [_fewest_fitting(order, trial, target_bytes, (swaps, swapped, swapped_baseline))
                       for order in (groups, groups[::-1])]
            swaps, swapped, swapped_baseline = min(
                fitting, key=lambda option: (_list_bytes(analysis.graph, option[0]), len(option[0])))
        chosen += swaps
        host.left -= _list_bytes(analysis.graph, swaps)
        current, current_baseline = swapped, swapped_baseline
    return tuple(chosen), current, current_baseline


def _fewest_fitting(groups: list[list[LoopSwap]], trial, target_bytes: int, whole: tuple
                    ) -> tuple[list[LoopSwap], StepAnalysis, Baseline]:
    """The shortest prefix of `groups` whose swaps fit `target_bytes` (bisection; `trial(swaps)` gives the
    step so swapped and its baseline), with what `trial` gave for it; `whole`, `trial` of every group, when
    only all fit."""
    low, high, best = 1, len(groups), whole
    while low < high:
        middle = (low + high) // 2
        part = [swap for group in groups[:middle] for swap in group]
        part_analysis, part_baseline = trial(part)
        if part_baseline.fits(target_bytes):
            high, best = middle, (part, part_analysis, part_baseline)
        else:
            low = middle + 1
    return best


def _buffer_groups(graph: Graph, swaps: Sequence[LoopSwap]) -> list[list[LoopSwap]]:
    """`swaps` (of one loop) grouped by the buffer their elements are (`LoopSwap.buffer`; an unknown
    buffer: a group of its own), the groups by decreasing list bytes, ties in `swaps`' order. A group's
    bytes are sized on one of its lists (`seqmem.edge.capture` counts a shared buffer once); groups sized
    at 0 bytes (elements another list holds) are left out: swapping them frees nothing."""
    groups: dict[object, list[LoopSwap]] = {}
    for swap in swaps:
        groups.setdefault(swap.accumulator if swap.buffer is None else swap.buffer, []).append(swap)
    saving = [group for group in groups.values() if any(graph.tensor(swap.tensor).size_bytes for swap in group)]
    return sorted(saving, key=lambda group: -_list_bytes(graph, group))


def _list_bytes(graph: Graph, swaps: Sequence[LoopSwap]) -> int:
    """Bytes of the full lists of `swaps`: what they hold in host memory once swapped."""
    return sum(swap.element_bytes * iterations(graph, swap, swaps) for swap in swaps)


def _loop_fields(loop_swaps: tuple[LoopSwap, ...], depth: Optional[int], graph: Graph, machine: MachineModel) -> dict:
    """The plan's record of `loop_swaps` (sized in the step's unswapped `graph`); each list's bytes cross to the host and back, one element at a
    time and not hidden behind the loop's computation (counted as overhead)."""
    if not loop_swaps:
        return {"predicted_overhead_s": 0.0}
    swapped = _list_bytes(graph, loop_swaps)
    return {"loop_swaps": loop_swaps, "loop_swapped_bytes": swapped, "loop_parallel_iterations": depth,
            "predicted_overhead_s": 2 * transfer_time_s(swapped, machine)}


@dataclass
class _HostRoom:
    """Host memory the plan's swaps may still take (bytes; inf: no limit), and whether it refused any."""

    left: float
    refused: bool = False

    def admits(self, host_bytes: int) -> bool:
        if host_bytes <= self.left:
            return True
        self.refused = True
        return False


@dataclass(frozen=True)
class _Option:
    """One way to conserve a candidate: its decision, the schedule position it is restored at (the
    tensor is off the device at positions out_pos < i < in_pos), the bytes the device holds at in_pos
    besides the copy, and the tensors a recomputation reads (they must stay on the device)."""

    decision: SwapDecision
    in_pos: int
    restore_bytes: int
    reads: frozenset[TensorRef] = frozenset()


@dataclass(frozen=True)
class _Candidate:
    """A feature map the selector may conserve, after its last forward reader at `out_pos`, in any of `options`."""

    tensor: TensorRef
    out_pos: int
    options: tuple[_Option, ...]


def _candidates(analysis: StepAnalysis, trace: MemoryTrace, machine: MachineModel, options: ConservationOptions,
                position: Mapping[str, int], loop_swapped: set[TensorRef]):
    """Feature maps worth trying, longest-lived first, each with the kinds that can conserve it; and the skipped."""
    graph, anatomy, timing = analysis.graph, analysis.anatomy, analysis.timing
    triggers = TriggerIndex(graph, timing, anatomy.backward, position)
    aliases: dict[TensorRef, list[TensorRef]] = {}
    for tensor, owner in trace.buffer_of.items():
        aliases.setdefault(owner, []).append(tensor)
    distance = timing.distance_to_loss_s
    ordered = sorted(anatomy.feature_maps, key=lambda r: (-distance.get(r.node, 0.0), position[r.node], r.index))
    held = _held_tensors(graph, anatomy, trace, position)
    candidates, skipped = [], []
    for ref in ordered + list(held):
        size = graph.tensor(ref).size_bytes
        if ref in loop_swapped:
            skipped.append(SkippedCandidate(ref, size or 0, "a loop accumulator swapped element by element"))
            continue
        if size is None or size < options.min_bytes:
            skipped.append(SkippedCandidate(ref, size or 0, f"smaller than {options.min_bytes} bytes"))
            continue
        if ref in held:
            found = _held_span(graph, ref, held[ref], aliases.get(trace.buffer_of.get(ref), ()), position)
        else:
            found = _feature_map_span(graph, ref, anatomy, aliases.get(trace.buffer_of.get(ref), ()), position)
        if isinstance(found, str):
            skipped.append(SkippedCandidate(ref, size, found))
            continue
        consumers, out_pos = found
        slack = timing.start_s[consumers[0]] - timing.completion_s[ref.node]
        if slack < options.min_slack_s:
            skipped.append(SkippedCandidate(ref, size, f"lives {1e3 * slack:.3f} ms, under min_slack_s"))
            continue
        kinds, reasons = [], []
        for kind in options.kinds:
            for late in _restore_timings(kind, machine):
                option = _option(kind, analysis, ref, size, consumers, out_pos, position, triggers, machine,
                                 options, late)
                if isinstance(option, str):
                    reasons.append(option)
                elif all(option.decision.trigger != other.decision.trigger or other.decision.kind != kind
                         for other in kinds):
                    kinds.append(option)
        if kinds:
            candidates.append(_Candidate(ref, out_pos, tuple(kinds)))
        else:
            skipped.append(SkippedCandidate(ref, size, "; ".join(dict.fromkeys(reasons))))
    return candidates, skipped


def _feature_map_span(graph: Graph, ref: TensorRef, anatomy: StepAnatomy, aliases: Sequence[TensorRef],
                      position: Mapping[str, int]) -> tuple[tuple[str, ...], int] | str:
    """A feature map's backward readers of its contents (sorted by position) and the position after which
    it may leave the device (its and its aliases' last forward reader); or why it cannot."""
    # forward-time aliases only: a backward op writing in place into this buffer would, after the
    # rewrite, write into the restored copy instead
    sharing = [a for a in aliases if a != ref and a.node not in anatomy.backward]
    if any(_backward_content_readers(graph, a, anatomy, position) for a in sharing):
        return "shares its buffer with another tensor read in backward"
    consumers = _backward_content_readers(graph, ref, anatomy, position)
    if not consumers:
        return "no backward op reads its contents"
    return consumers, max(position[_last_early_reader(graph, a, consumers if a == ref else (), position)]
                          for a in [ref, *sharing])


def _held_span(graph: Graph, ref: TensorRef, late_readers: tuple[str, ...], aliases: Sequence[TensorRef],
               position: Mapping[str, int]) -> tuple[tuple[str, ...], int] | str:
    """A held backward tensor's late readers and the position after which it may leave the device (its
    other readers', and every reader of the tensors sharing its buffer before the late readers run: a late
    reader writing in place would, after the rewrite, write into the restored copy); or why it cannot."""
    first_late = position[late_readers[0]]
    early = [r for r in graph.consumers(ref) if r not in late_readers]
    early += [r for a in aliases if a != ref and position[a.node] < first_late for r in graph.consumers(a)]
    out_pos = max([position[ref.node]] + [position[r] for r in early])
    if out_pos >= first_late:
        return "a tensor sharing its buffer is read until its late readers run"
    return late_readers, out_pos


def _restore_timings(kind: str, machine: MachineModel) -> tuple[bool, ...]:
    """When a copy of `kind` may be restored: early enough to hide its transfer (False), and also right
    after the last backward node before its first reader in the order the step runs in (True), which keeps
    the restored copy off the device in between: what a tight budget needs when early restores set the
    peak. Where copies overlap computation a late restore costs the transfer; where they do not, "early"
    is when the ASAP estimate says the first reader starts, which on one stream can be many nodes
    before it runs."""
    return (False, True) if kind in HOST_KINDS else (False,)


def _option(kind: str, analysis: StepAnalysis, ref: TensorRef, size: int, consumers: tuple[str, ...], out_pos: int,
            position: Mapping[str, int], triggers: TriggerIndex, machine: MachineModel,
            options: ConservationOptions, late: bool = False) -> _Option | str:
    """How `kind` would conserve `ref`, or why it cannot; `late`: restored just before its first reader
    (see `_restore_timings`)."""
    graph, timing = analysis.graph, analysis.timing
    first_use_s = timing.start_s[consumers[0]]
    compressed = (size + 1) // 2
    cast_s = (size + compressed) / machine.memory_bytes_per_s  # one cast, either way
    transfer_s = transfer_time_s({"swap": size, "compress+swap": compressed}.get(kind, 0), machine)
    reads: frozenset[TensorRef] = frozenset()
    chain: tuple[str, ...] = ()
    if kind in LOSSY_KINDS and graph.tensor(ref).dtype != "float32":
        return f"{graph.tensor(ref).dtype}: only float32 tensors are compressed"
    if kind == "recompute":
        found = _recompute_chain(analysis, ref, position[consumers[0]], position)
        if found is None:
            return "not a chain of cheap ops over tensors the device keeps anyway"
        chain, reads = found
        lead_s = sum(timing.completion_s[name] - timing.start_s[name] for name in chain)
    else:  # a copy that cannot overlap computation gains nothing by starting early: restore just in time
        lead_s = (transfer_s if machine.copies_overlap else 0.0) + (cast_s if kind in LOSSY_KINDS else 0.0)
    if late:
        trigger, hidden = triggers.last_before(consumers), False
    else:
        trigger, hidden = triggers.choose(consumers, lead_s)
    if trigger is None or position[trigger] <= out_pos:
        return "consumed almost immediately: no step between its uses"
    if kind in HOST_KINDS and machine.copies_overlap and (late or not hidden) \
            and first_use_s - timing.completion_s[ref.node] < lead_s:
        return "backward use follows within the transfer time"
    if kind == "recompute":
        cost_s = lead_s
    elif kind == "compress":
        cost_s = 2 * cast_s
    else:
        if machine.copies_overlap:
            copy_s = max(0.0, timing.completion_s[trigger] + lead_s - first_use_s)  # what computation does not hide
        else:
            copy_s = 2 * transfer_s  # out and in, on the compute's own time
        cost_s = copy_s + (2 * cast_s if kind == "compress+swap" else 0.0)
    decision = SwapDecision(ref, size, consumers, trigger, transfer_s, kind=kind, cost_s=cost_s,
                            compressed_dtype=options.compression if kind in LOSSY_KINDS else None, recompute=chain,
                            handle_bytes=machine.host_handle_bytes if kind in HOST_KINDS else 0)
    return _Option(decision, position[trigger] + 1, _restore_bytes(graph, decision), reads)


def _recompute_chain(analysis: StepAnalysis, ref: TensorRef, deadline: int, position: Mapping[str, int],
                     depth: int = 3) -> tuple[tuple[str, ...], frozenset[TensorRef]] | None:
    """The forward nodes (in order) that recompute `ref` from tensors the device keeps until `deadline` (a
    schedule position) anyway, and those tensors; None when `ref` is not such a chain of at most `depth`
    `RECOMPUTABLE_OPS`."""
    graph = analysis.graph
    node = graph.node(ref.node)
    if node.op not in RECOMPUTABLE_OPS or node.name in analysis.anatomy.backward:
        return None
    chain: dict[str, None] = {}
    reads: set[TensorRef] = set()
    for source in node.inputs:
        if _kept_until(graph, source, position) >= deadline:
            reads.add(source)
            continue
        inner = _recompute_chain(analysis, source, deadline, position, depth - 1) if depth > 1 else None
        if inner is None:
            return None
        chain.update(dict.fromkeys(inner[0]))
        reads |= inner[1]
    chain[node.name] = None
    return tuple(chain), frozenset(reads)


def _kept_until(graph: Graph, ref: TensorRef, position: Mapping[str, int]) -> float:
    """The last schedule position at which `ref`'s contents are still on the device (infinite for
    persistent tensors and graph outputs): its last reader's, since a buffer is overwritten in place only
    once no reader is left."""
    source = ref
    while (view := view_source(graph.node(source.node), source.index)) is not None:
        source = view
    if graph.node(source.node).persistent or ref in graph.outputs:
        return float("inf")
    readers = [position[r] for r in graph.consumers(ref) if graph.node(r).op not in SHAPE_OPS]
    return max(readers, default=-1)


def _select(candidates: Sequence[_Candidate], chosen: dict, tree: _MaxTree, target_live_bytes: int,
            max_decisions: Optional[int], host: _HostRoom) -> int:
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
                    or (current is not None and peak < current[1].in_pos):
                continue
            if current is not None:
                _unchoose(tree, candidate, current[1], chosen, host)
            option = _cheapest_helpful(candidate, peak, tree.max() - target_live_bytes, chosen, host)
            if option is None:
                if current is not None:
                    _choose(tree, candidate, current[1], chosen, host)
                continue
            _choose(tree, candidate, option, chosen, host)
            changed += 1
            progress = True
    return changed


def _cheapest_helpful(candidate: _Candidate, peak: int, needed_bytes: int, chosen: Mapping,
                      host: _HostRoom) -> _Option | None:
    """Of the options that free the tensor at position `peak` and fit the host's room: the cheapest that
    frees `needed_bytes`, else the one that frees most (the cheapest of those); None if none helps."""
    helpful = [option for option in candidate.options
               if peak < option.in_pos and option.decision.saved_bytes > 0 and not option.reads & chosen.keys()
               and host.admits(option.decision.host_bytes)]
    enough = [option for option in helpful if option.decision.saved_bytes >= needed_bytes]
    if enough:
        return min(enough, key=lambda option: (option.decision.cost_s, -option.decision.saved_bytes))
    return min(helpful, key=lambda option: (-option.decision.saved_bytes, option.decision.cost_s), default=None)


def _needed_by_recomputation(ref: TensorRef, chosen: Mapping) -> bool:
    return any(ref in option.reads for _, option in chosen.values())


def _choose(tree: _MaxTree, candidate: _Candidate, option: _Option, chosen: dict, host: _HostRoom) -> None:
    decision = option.decision
    host.left -= decision.host_bytes
    tree.add(candidate.out_pos + 1, option.in_pos, -decision.saved_bytes)
    tree.add(option.in_pos, option.in_pos + 1, option.restore_bytes + decision.resident_bytes)
    chosen[candidate.tensor] = (candidate, option)


def _unchoose(tree: _MaxTree, candidate: _Candidate, option: _Option, chosen: dict, host: _HostRoom) -> None:
    """Undo `_choose`."""
    decision = option.decision
    host.left += decision.host_bytes
    tree.add(candidate.out_pos + 1, option.in_pos, decision.saved_bytes)
    tree.add(option.in_pos, option.in_pos + 1, -(option.restore_bytes + decision.resident_bytes))
    del chosen[candidate.tensor]


def _plan(budget_bytes, target_bytes, before, chosen, skipped, candidates, options, peak_after=None) -> SwapPlan:
    decisions = tuple(chosen[c.tensor][1].decision for c in candidates if c.tensor in chosen)
    unused = tuple(
        SkippedCandidate(c.tensor, c.options[0].decision.size_bytes, "not needed: the peak fit without it")
        for c in candidates if c.tensor not in chosen
    )
    return SwapPlan(
        budget_bytes=budget_bytes,
        target_bytes=target_bytes,
        predicted_peak_before_bytes=before.peak_bytes,
        predicted_peak_after_bytes=before.peak_bytes if peak_after is None else peak_after,
        decisions=decisions,
        skipped=tuple(skipped) + unused,
        predicted_overhead_s=sum(d.cost_s for d in decisions),
        options=options,
    )
