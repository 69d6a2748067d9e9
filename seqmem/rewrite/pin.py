"""Pin a step's execution order with control edges (full serialization).

On one compute stream the order ops run in decides the peak, and TensorFlow's
executor picks its own: ready expensive kernels wait last-in-first-out, so a
backward pass can defer every filter gradient to its end. Pinning chains the
nodes of a planned order that allocate (all but `op_tables.INLINE_OPS`): each
waits, by a control edge, for the one before it, so the executor can run them
in no other order. Inline ops stay free; the executor runs them the moment
they are ready. `sim.schedule.pinned_order` predicts the order that results.

A function call waits by a control edge even where it already reads the node
before it: TensorFlow inlines the call, and a data edge then orders only the
body's nodes that read that input, while the call's control inputs gate every
input of the body: with only the data edge, a called backward body's
`zeros_like` and first transpose can run before the ops planned ahead of the
call, above the predicted peak.

The node after a loop or a conditional waits for it by a control edge even
where it reads its output: TensorFlow lowers such a node into its functions'
nodes and feeds each consumer from the node making that output, where a
control edge from it waits for every output. A lowered loop hands out a
resource its body passes through before it runs, so a reader of that resource
(a gradient accumulator's `VariableShape`, then `Fill`) could run far earlier
than planned, in some processes and not in others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from seqmem.ir.graph import Graph
from seqmem.ir.op_tables import FUNCTION_CALL_OPS, LOWERED_CONTROL_FLOW_OPS
from seqmem.sim.schedule import pinned_nodes

__all__ = ["pin"]



def pin(graph: Graph, order: Sequence[str]) -> Graph:
    """`graph` with each pinned node of `order` waiting for the one before it.

    order: every node of `graph`, in an order that respects its edges. A pair
    already ordered by a direct edge gets no second one, except before a
    function call and after a loop or a conditional: TensorFlow inlines or
    lowers them, and a data edge then orders only the body's nodes that read
    that input or make that output, where a control edge orders them all
    (module docstring). Raises ValueError when
    `order` does not list the graph's nodes exactly once.
    """
    if len(order) != len(graph) or set(order) != set(graph.nodes):
        raise ValueError("order must list every node of the graph exactly once")
    waits_for = {}
    chain = pinned_nodes(graph, order)
    for before, after in zip(chain, chain[1:]):
        if (before not in graph.predecessors(after) or graph.nodes[after].op in FUNCTION_CALL_OPS
                or graph.nodes[before].op in LOWERED_CONTROL_FLOW_OPS):
            waits_for[after] = before
    nodes = [
        dataclasses.replace(node, control_inputs=node.control_inputs + (waits_for[name],))
        if name in waits_for else node
        for name, node in graph.nodes.items()
    ]
    return graph.replace(nodes=nodes)
