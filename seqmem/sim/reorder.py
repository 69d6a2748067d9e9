"""Peak-directed refinement of a pinned order (partial serialization, after Janssen et al.).

A pinned step runs its deferred ASAP schedule, where nodes that could start
together run one after the other in graph order. Two branches that read the
same gradient then interleave: ResNet-50's first bottleneck ran its main and
its shortcut batch-norm gradients back to back, so the main branch's output
gradient waited, beside the shortcut's restored input and its own output
gradient, for the main branch's convolution gradients (four tensors of one
size). Finishing one branch first holds three.

`refine_order` looks at what is live at the simulated peak and tries, for the
largest of those tensors,

- sinking the node that runs at the peak, or a live tensor's producer, to just
  before its first reader in the chain (its output is allocated later), and
- hoisting a live tensor's remaining readers to just before the peak (it is
  freed earlier),

keeps the move that lowers the peak most (or, at the same peak, leaves fewest
nodes running at it), and repeats while one does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Optional

from seqmem.ir.graph import Graph, TensorRef
from seqmem.sim.trace import MemoryTrace

__all__ = ["refine_order"]

_TENSORS_TRIED = 8  # the largest tensors live at the peak whose moves are tried each round


def refine_order(graph: Graph, order: Sequence[str], chained: frozenset[str],
                 realize: Callable[[tuple[str, ...]], tuple[str, ...]],
                 trace_of: Callable[[tuple[str, ...]], MemoryTrace], max_trials: int = 64) -> tuple[str, ...]:
    """An order of `graph`'s nodes whose simulated peak is at most `order`'s (`order` itself when no move
    lowers it).

    chained: the nodes a pinned step chains (`sim.schedule.pinned_nodes`); a node is sunk to just before
    its first chained reader. realize: the order the step runs in once a candidate order is pinned
    (`executor_order` with the candidate's chain); it raises ValueError for a candidate the graph's edges
    contradict. trace_of: the simulated trace of a realized order (swaps included); it raises ValueError
    for an order a swap cannot run in. Such candidates are skipped. At most `max_trials` candidate orders
    are simulated (each costs one `trace_of`), so that the refinement's time is bounded on any graph.
    """
    order = tuple(order)
    trace = trace_of(order)
    trials = 0
    while trials < max_trials:
        best = None
        for candidate in list(dict.fromkeys(_moves(graph, order, trace, chained)))[:max_trials - trials]:
            trials += 1
            try:
                realized = realize(candidate)
                candidate_trace = trace_of(realized)
            except ValueError:
                continue
            if best is None or _score(candidate_trace) < _score(best[1]):
                best = (realized, candidate_trace)
        if best is None or _score(best[1]) >= _score(trace):
            break
        order, trace = best
    return order


def _score(trace: MemoryTrace) -> tuple[int, int]:
    """What a move must lower: the peak, then how many nodes run at it (so that of two nodes at the same
    peak, one can be lowered at a time)."""
    timeline = trace.busiest()
    at_peak = timeline.peak_bytes - timeline.persistent_bytes
    return trace.peak_bytes, sum(live == at_peak for live in timeline.live_bytes)


def _moves(graph: Graph, order: tuple[str, ...], trace: MemoryTrace, chained: frozenset[str]) -> Iterator[tuple]:
    """Candidate orders, each one move from `order` at its simulated peak."""
    timeline = trace.busiest()
    peak = timeline.peak_step
    at_peak = order[peak]
    position = {name: i for i, name in enumerate(order)}
    moved = [_sunk(graph, order, position, at_peak, peak, chained)]
    for tensor, _ in timeline.live_at_peak[:_TENSORS_TRIED]:
        if tensor.node != at_peak and position[tensor.node] < peak:
            moved.append(_sunk(graph, order, position, tensor.node, peak, chained))
        later = [reader for reader in graph.consumers(tensor) if position[reader] > peak]
        if later and at_peak not in graph.consumers(tensor):
            moved.append(_hoisted(graph, order, position, later, peak))
    yield from (candidate for candidate in moved if candidate is not None)


def _sunk(graph, order, position, name: str, peak: int, chained: frozenset[str]) -> Optional[tuple]:
    """`order` with `name` moved to just before its first chained reader, where that lies past the peak,
    together with what runs in between and waits on it (an update waiting on a gradient that reads
    the old weights, an inline reader); None where that reader is not past the peak."""
    readers = {reader for index in range(len(graph.node(name).outputs))
               for reader in graph.consumers(TensorRef(name, index)) if reader in chained}
    first = min((position[reader] for reader in readers), default=len(order))
    if first <= peak or first - 1 <= position[name]:
        return None
    moving = {name}
    for between in order[position[name] + 1:first]:
        if any(predecessor in moving for predecessor in graph.ordering_predecessors(between)):
            moving.add(between)
    window = order[position[name]:first]
    return (order[:position[name]] + tuple(n for n in window if n not in moving)
            + tuple(n for n in window if n in moving) + order[first:])


def _hoisted(graph, order, position, names: Sequence[str], peak: int) -> Optional[tuple]:
    """`order` with `names` moved to just before the peak, together with what they wait on from the peak
    on; None where that includes the node at the peak."""
    last = max(position[name] for name in names)
    moving = set(names)
    for between in reversed(order[peak:last + 1]):
        if between in moving:
            moving.update(graph.ordering_predecessors(between))
    if order[peak] in moving:
        return None
    window = order[peak:last + 1]
    return (order[:peak] + tuple(n for n in window if n in moving) + tuple(n for n in window if n not in moving)
            + order[last + 1:])
