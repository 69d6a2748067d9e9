"""Which loop accumulators to swap element by element (`seqmem.edge.loop_swap`), before any feature map.

Forward loops go longest-lived first, each swapped whole while that lowers the
predicted peak; of the loop that makes the step fit, the fewest accumulators
that fit, largest first or smallest first, whichever swaps fewer bytes (those
that save one buffer, across iterations too, go together).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

from seqmem.analyze.analysis import StepAnalysis
from seqmem.analyze.critical_path import MachineModel, transfer_time_s
from seqmem.ir.graph import Graph
from seqmem.plan.events import Baseline, simulate_baseline
from seqmem.plan.host_room import HostRoom
from seqmem.sim.loop_swaps import iterations, with_loop_swaps
from seqmem.decisions.plan import LoopSwap

__all__ = ["choose_loop_swaps", "loop_swap_fields", "loop_swapped"]


def loop_swapped(analysis: StepAnalysis, swaps: Sequence[LoopSwap], depth: int) -> StepAnalysis:
    """The analysis of the step with `swaps` made and loops bounded to `depth` iterations, as the simulator
    sees it (`seqmem.sim.loop_swaps`)."""
    graph, scratch = with_loop_swaps(analysis.graph, analysis.scratch_bytes, swaps, depth, analysis.calls)
    return dataclasses.replace(analysis, graph=graph, scratch_bytes=scratch)


def choose_loop_swaps(analysis: StepAnalysis, baseline: Baseline, target_bytes: int, depth: int, allocator: str,
                       arena_bytes: Optional[int], host: HostRoom
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


def loop_swap_fields(loop_swaps: tuple[LoopSwap, ...], depth: Optional[int], graph: Graph, machine: MachineModel) -> dict:
    """The plan's record of `loop_swaps` (sized in the step's unswapped `graph`); each list's bytes cross to the host and back, one element at a
    time and not hidden behind the loop's computation (counted as overhead)."""
    if not loop_swaps:
        return {"predicted_overhead_s": 0.0}
    swapped = _list_bytes(graph, loop_swaps)
    return {"loop_swaps": loop_swaps, "loop_swapped_bytes": swapped, "loop_parallel_iterations": depth,
            "predicted_overhead_s": 2 * transfer_time_s(swapped, machine)}
