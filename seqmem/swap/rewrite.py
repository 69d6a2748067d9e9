"""Rewrite a graph to carry out a `SwapPlan`.

For every swapped tensor `t` (produced by P, read by forward nodes F and backward
nodes B):

    before:  P:t ──> F                 after:  P:t ──> F
               └───> B                           └───> swap_out ──> swap_in ──> B
                                                                       ^
                                                 trigger ─ ─ ─ ─ ─ ─ ─ ┘ (control edge)

One swap-out reads the tensor right after its producer (all backward readers
share it); one swap-in, started by the trigger, feeds every backward reader.
Forward readers keep the original. The nodes themselves come from a backend
(`seqmem.edge.swap_nodes`), which knows the device; this module only edits the IR.

A plan with a `pinned_order` is pinned to it (`seqmem.swap.pin`), with each
swap-out right after its producer and each swap-in right after its trigger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from seqmem.gc_pause import without_gc
from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef
from seqmem.swap.pin import pin
from seqmem.swap.plan import SwapPlan

__all__ = ["SwapBackend", "rewrite", "SWAP_SCOPE"]

SWAP_SCOPE = "seqmem_swap"


class SwapBackend(Protocol):
    """Makes the nodes that move one tensor to the host and back."""

    def swap_out(self, name: str, tensor: TensorRef, info: TensorInfo, producer: Node) -> Sequence[Node]:
        """Nodes that copy `tensor` to the host; the last one's output 0 is the host copy."""

    def swap_in(self, name: str, host: TensorRef, info: TensorInfo, trigger: str, consumer: Node) -> Sequence[Node]:
        """Nodes that bring `host` back, started by a control edge from `trigger`; the last one's output 0 is the copy."""


@without_gc
def rewrite(graph: Graph, plan: SwapPlan, backend: SwapBackend) -> Graph:
    """A new graph in which the plan's tensors are swapped out and back in.

    Raises GraphError (from the new graph's construction) if the plan names
    nodes or tensors the graph lacks.
    """
    if not plan.decisions and not plan.pinned_order:
        return graph
    replacements: dict[tuple[str, TensorRef], TensorRef] = {}
    added: list[Node] = []
    placed_after: dict[str, list[str]] = {}  # swap nodes by the node they follow in a pinned order
    for number, decision in enumerate(plan.decisions):
        ref, info = decision.tensor, graph.tensor(decision.tensor)
        base = f"{SWAP_SCOPE}/{number}_{ref.node.replace('/', '_')}_{ref.index}"
        out_nodes = list(backend.swap_out(f"{base}/out", ref, info, graph.node(ref.node)))
        in_nodes = list(backend.swap_in(
            f"{base}/in", TensorRef(out_nodes[-1].name, 0), info, decision.trigger, graph.node(decision.consumers[0])
        ))
        added += out_nodes + in_nodes
        placed_after.setdefault(ref.node, []).extend(n.name for n in out_nodes)
        placed_after.setdefault(decision.trigger, []).extend(n.name for n in in_nodes)
        for consumer in decision.consumers:
            replacements[(consumer, ref)] = TensorRef(in_nodes[-1].name, 0)
    nodes = []
    for node in graph.nodes.values():
        inputs = tuple(replacements.get((node.name, ref), ref) for ref in node.inputs)
        nodes.append(node if inputs == node.inputs else dataclasses.replace(node, inputs=inputs))
    rewritten = graph.replace(nodes=nodes + added)
    if not plan.pinned_order:
        return rewritten
    return pin(rewritten, [n for name in plan.pinned_order for n in (name, *placed_after.get(name, ()))])
