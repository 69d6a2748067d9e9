"""Rewrite a graph to carry out a `Plan`.

For every swapped tensor `t` (produced by P, read by forward nodes F and backward
nodes B):

    before:  P:t ──> F                 after:  P:t ──> F
               └───> B                           └───> swap_out ──> swap_in ──> B
                                                                       ^
                                                 trigger ─ ─ ─ ─ ─ ─ ─ ┘ (control edge)

One swap-out reads the tensor right after its producer (all backward readers
share it); one swap-in, started by the trigger, feeds every backward reader.
Forward readers keep the original. Where B is one conditional (`Decision.in_branch`),
swap_in's nodes are marked for `seqmem.edge.branch_restores`, which moves them into
its branches. The other kinds follow the same shape:
"compress" casts `t` to its compressed dtype once F are done and casts it back
after the trigger; "compress+swap" swaps the compressed cast; "recompute" copies
the forward nodes that made `t`, each started by the trigger, and B read the
copy. The nodes themselves come from a backend (`seqmem.edge.swap_nodes`),
which knows the device; this module only edits the IR.

A plan's `split_barriers` are split first (`seqmem.ir.barriers`). A plan
with a `pinned_order` is pinned to it (`seqmem.rewrite.pin`), with each
swap-out right after its producer and each swap-in right after its trigger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from seqmem.gc_pause import without_gc
from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef
from seqmem.ir.op_tables import SHAPE_OPS
from seqmem.ir.barriers import split_barriers
from seqmem.rewrite.pin import pin
from seqmem.decisions.kinds import Compress, CompressAndSwap, Recompute
from seqmem.decisions.plan import Decision, Plan

__all__ = ["SwapBackend", "rewrite", "SWAP_MARK"]

SWAP_MARK = "seqmem_swap"  # in the name of every node a decision adds (`_decision_name`)


class SwapBackend(Protocol):
    """Makes the nodes that move one tensor to the host and back, and cast one."""

    def swap_out(self, name: str, tensor: TensorRef, info: TensorInfo, producer: Node) -> Sequence[Node]:
        """Nodes that copy `tensor` to the host; the last one's output 0 is the host copy."""

    def swap_in(self, name: str, host: TensorRef, info: TensorInfo, trigger: str, consumer: Node) -> Sequence[Node]:
        """Nodes that bring `host` back, started by a control edge from `trigger`; the last one's output 0 is the copy."""

    def cast(self, name: str, tensor: TensorRef, source: TensorInfo, target: TensorInfo,
             control_inputs: Sequence[str], device: str) -> Node:
        """A node on `device` casting `tensor` (described by `source`) to `target`'s dtype, after `control_inputs`."""

    def in_branch(self, node: Node) -> Node:
        """`node`, marked as restoring a copy that the conditional reading it restores in its branches."""


@without_gc
def rewrite(graph: Graph, plan: Plan, backend: SwapBackend) -> Graph:
    """A new graph in which the plan's tensors are conserved and restored, each by its decision's kind.

    Raises GraphError (from the new graph's construction) if the plan names
    nodes or tensors the graph lacks.
    """
    graph = split_barriers(graph, plan.split_barriers)
    if not plan.decisions and not plan.pinned_order:
        return graph
    replacements: dict[tuple[str, TensorRef], TensorRef] = {}
    added: list[Node] = []
    placed_after: dict[str, list[str]] = {}  # new nodes by the node they follow in a pinned order
    pinned_position = {name: i for i, name in enumerate(plan.pinned_order)}
    for number, decision in enumerate(plan.decisions):
        ref = decision.tensor
        base = _decision_name(ref, number)
        if isinstance(decision.kind, Recompute):
            out_nodes, in_nodes = [], _recomputed(graph, decision, base)
            restored = TensorRef(in_nodes[-1].name, ref.index)
            out_after = ref.node
        else:
            out_nodes, in_nodes, out_after = _conserved(graph, decision, base, backend, pinned_position)
            restored = TensorRef(in_nodes[-1].name, 0)
        if decision.in_branch:
            in_nodes = [backend.in_branch(node) for node in in_nodes]
        added += out_nodes + in_nodes
        placed_after.setdefault(out_after, []).extend(n.name for n in out_nodes)
        placed_after.setdefault(decision.trigger, []).extend(n.name for n in in_nodes)
        for consumer in decision.consumers:
            replacements[(consumer, ref)] = restored
    nodes = []
    for node in graph.nodes.values():
        inputs = tuple(replacements.get((node.name, ref), ref) for ref in node.inputs)
        nodes.append(node if inputs == node.inputs else dataclasses.replace(node, inputs=inputs))
    rewritten = graph.replace(nodes=nodes + added)
    if not plan.pinned_order:
        return rewritten
    return pin(rewritten, [n for name in plan.pinned_order for n in (name, *placed_after.get(name, ()))])


def _decision_name(ref: TensorRef, number: int) -> str:
    """The name the nodes of decision `number` (conserving `ref`) start with: `ref`'s node's, then a mark.

    Grappler sorts a commutative op's inputs by name before it regroups sums and
    products (`ir.regrouped`), so a copy that replaces `ref` as an input must
    sort where `ref` did, or the rewritten step rounds otherwise than the
    original: after `node`, the mark begins with "-", the first of the
    characters a node name may hold; after `node:1`, with ">", the first one
    after ":".
    """
    return f"{ref.node}{'-' if ref.index == 0 else '>'}{SWAP_MARK}{number}_{ref.index}"


def _conserved(graph: Graph, decision: Decision, base: str, backend: SwapBackend,
               pinned_position: dict[str, int]) -> tuple[list[Node], list[Node], str]:
    """The nodes that take a swapped or compressed tensor off the device and those that restore it (the last
    one's output 0 is the copy), and the node the first ones follow."""
    ref, info = decision.tensor, graph.tensor(decision.tensor)
    producer, consumer = graph.node(ref.node), graph.node(decision.consumers[0])
    out_nodes: list[Node] = []
    in_nodes: list[Node] = []
    moved, moved_info, out_after = ref, info, ref.node
    kind = decision.kind
    compressed = isinstance(kind, (Compress, CompressAndSwap))
    if compressed:
        moved_info = TensorInfo(kind.dtype, info.shape, decision.compressed_bytes)
        after: tuple[str, ...] = ()
        if isinstance(kind, Compress):  # kept on the device: cast once the forward readers are done with it
            after = tuple(sorted({r for r in graph.consumers(ref) if r not in decision.consumers
                                  and graph.node(r).op not in SHAPE_OPS}))
            out_after = max(after, key=lambda name: pinned_position.get(name, -1), default=ref.node)
        out_nodes.append(backend.cast(f"{base}/compress", ref, info, moved_info, after, producer.device))
        moved = TensorRef(out_nodes[-1].name, 0)
    if kind.to_host:
        out_nodes += backend.swap_out(f"{base}/out", moved, moved_info, producer)
        in_nodes += backend.swap_in(f"{base}/in", TensorRef(out_nodes[-1].name, 0), moved_info, decision.trigger,
                                    consumer)
        moved = TensorRef(in_nodes[-1].name, 0)
    if compressed:
        control = (decision.trigger,) if isinstance(kind, Compress) else ()
        in_nodes.append(backend.cast(f"{base}/decompress", moved, moved_info, info, control, consumer.device))
    return out_nodes, in_nodes, out_after


def _recomputed(graph: Graph, decision: Decision, base: str) -> list[Node]:
    """Copies of the chain the decision's `Recompute` re-runs reading each other's outputs, each started by the trigger."""
    copies: dict[str, str] = {name: f"{base}/recompute/{name.replace('/', '_')}" for name in decision.kind.nodes}
    nodes = []
    for name in decision.kind.nodes:
        node = graph.node(name)
        inputs = tuple(TensorRef(copies[r.node], r.index) if r.node in copies else r for r in node.inputs)
        nodes.append(dataclasses.replace(node, name=copies[name], inputs=inputs,
                                         control_inputs=node.control_inputs + (decision.trigger,)))
    return nodes
