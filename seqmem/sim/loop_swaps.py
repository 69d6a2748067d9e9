"""How the simulator sees loop accumulators swapped to host (`seqmem.edge.loop_swap`).

The simulator treats a while loop as one node. A swapped accumulator's list
holds one serialized host buffer per iteration; on the device each element is a
scalar string, one allocator chunk (`SERIALIZED_ELEMENT_BYTES`; measured: 258-284
bytes per element on the emulated device). While a loop runs, up to `depth`
iterations' elements of its swapped lists are on the device at once (the
forward loop's before they are serialized, the gradient loop's once parsed):
charged to both loops as scratch. A gradient call that frees the lists it pops
(`seqmem.sim.calls.CallCharge`) frees only their handles once they are swapped:
it is charged again for the lists' swapped sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from seqmem.ir.graph import Graph
from seqmem.decisions.plan import LoopSwap
from seqmem.sim.calls import CallCharge

__all__ = ["SERIALIZED_ELEMENT_BYTES", "iterations", "with_loop_swaps"]

SERIALIZED_ELEMENT_BYTES = 256  # the BFC allocator's smallest chunk, holding one scalar string


def iterations(graph: Graph, swap: LoopSwap, swaps: Sequence[LoopSwap] = ()) -> int:
    """Elements the full list holds: its bytes over one element's. A list sized 0 because another list of
    the same loop in `swaps` holds its buffers (the same `LoopSwap.buffer`; `seqmem.edge.capture` counts
    them there) holds as many as that list, each serialized on its own once swapped; a list of another
    list's elements or of a variable's value, 0."""
    own = graph.tensor(swap.tensor).size_bytes // swap.element_bytes
    if own or swap.buffer is None:
        return own
    return max((graph.tensor(other.tensor).size_bytes // other.element_bytes for other in swaps
                if other.forward_loop == swap.forward_loop and other.buffer == swap.buffer), default=0)


def with_loop_swaps(graph: Graph, scratch_bytes: Mapping[str, int], swaps: Sequence[LoopSwap],
                    depth: int, calls: Mapping[str, CallCharge] = MappingProxyType({})) -> tuple[Graph, dict[str, int]]:
    """`graph` with each swapped list sized as its host buffers' device handles, and `scratch_bytes` with
    each loop charged `depth` iterations' elements of its swapped lists, and each call of `calls` (by node
    name) charged for its arguments' bytes in the returned graph instead of in `graph`.
    Raises ValueError for a swap whose list or element size is unknown."""
    unsized = [swap.accumulator for swap in swaps
               if not swap.element_bytes or graph.tensor(swap.tensor).size_bytes is None]
    if unsized:
        raise ValueError(f"loop accumulators of unknown size cannot be planned: {unsized}")
    resized: dict[str, dict[int, int]] = {}
    scratch = dict(scratch_bytes)
    for swap in swaps:
        resized.setdefault(swap.forward_loop, {})[swap.forward_index] = (iterations(graph, swap, swaps)
                                                                         * SERIALIZED_ELEMENT_BYTES)
        for loop in (swap.forward_loop, swap.gradient_loop):
            scratch[loop] = scratch.get(loop, 0) + depth * swap.element_bytes
    nodes = []
    for name, node in graph.nodes.items():
        if name in resized:
            outputs = tuple(dataclasses.replace(info, size_bytes=resized[name][i],
                                                element_bytes=SERIALIZED_ELEMENT_BYTES)
                            if i in resized[name] else info for i, info in enumerate(node.outputs))
            node = dataclasses.replace(node, outputs=outputs)
        nodes.append(node)
    swapped = graph.replace(nodes=nodes)
    for name, charge in calls.items():
        if name in scratch and name in graph.nodes:
            scratch[name] += _charge(charge, swapped, name) - _charge(charge, graph, name)
    return swapped, scratch


def _charge(charge: CallCharge, graph: Graph, call: str) -> int:
    """`charge` of node `call` for its inputs' bytes in `graph`."""
    inputs = graph.node(call).inputs
    return charge.bytes(lambda index: graph.tensor(inputs[index]).size_bytes or 0)
