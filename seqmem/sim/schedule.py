"""The order in which the simulator runs a graph's nodes."""

from __future__ import annotations

from seqmem.critical_path import Timing
from seqmem.ir.graph import Graph

__all__ = ["schedule"]


def schedule(graph: Graph, timing: Timing) -> tuple[str, ...]:
    """Execution order: nodes by estimated (ASAP) start time, ties broken topologically."""
    position = {name: i for i, name in enumerate(graph.topological_order())}
    return tuple(sorted(position, key=lambda name: (timing.start_s[name], position[name])))
