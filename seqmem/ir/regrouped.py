"""The nodes Grappler's graph optimizer regroups, as long as no control edge touches them.

Three of its rewrites change how a chain of arithmetic rounds: the arithmetic
optimizer's AddOpsRewrite collapses a tree of sums, each read by the next
alone, into one AddN of their inputs; its MinimizeBroadcasts re-associates a
chain of one binary op so that the smallest operands meet first; constant
folding's ConstantPushDown moves a constant from a sum or product down into
the sum or product it reads alone. A control edge into or out of either node
of such a pair changes what they do: AddOpsRewrite and MinimizeBroadcasts skip
a node with one, and Keras MobileNetV3's hard-swish gradient (g * x) * c,
rounded as g * (c * x) in the original, was rounded as (c * g) * x once its
outer product waited for another node.

A pinned step leaves pairs of sums and pairs of products unchained
(`regrouped_pairs`). A tree of sums collapsed into one AddN does not add in
the tree's order: the arithmetic optimizer sorts an AddN's inputs by name
(`CanonicalizeNode`), so a chained tree `(b + c) + a` of three losses summed
gave other bits than the original's `AddN(a, b, c)`. A pinned loop body leaves
its sums free and chains its products (`seqmem.edge.pinned_bodies`): there a
chained sum changed the NMT step's gradient, and free products in a Keras
LSTM's body took the zoo's stacked LSTM LM over its budget.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from seqmem.ir.graph import Graph
from seqmem.ir.op_tables import PRODUCT_OPS, SUM_OPS

__all__ = ["regrouped_nodes", "regrouped_pairs"]


def regrouped_nodes(ops: Mapping[str, str], readers: Mapping[str, Sequence[str]],
                    kinds: Sequence[Collection[str]]) -> frozenset[str]:
    """The nodes of a graph in a pair Grappler may regroup: a node of one of `kinds` (op types) whose one
    reader is of the same kind, and that reader (module docstring).

    ops: each node's op type, by name; readers: the nodes reading each node's
    outputs by data edges, one entry per edge (a node read twice by one reader
    has two readers, as Grappler counts them).
    """
    regrouped: set[str] = set()
    for name, op in ops.items():
        reading = readers.get(name, ())
        if len(reading) != 1:
            continue
        (reader,) = reading
        if any(op in kind and ops[reader] in kind for kind in kinds):
            regrouped |= {name, reader}
    return frozenset(regrouped)


def regrouped_pairs(graph: Graph) -> frozenset[str]:
    """The pairs of sums and of products of a seqmem `Graph` that Grappler may regroup (`regrouped_nodes`)."""
    readers: dict[str, list[str]] = {}
    for node in graph.nodes.values():
        for ref in node.inputs:
            readers.setdefault(ref.node, []).append(node.name)
    return regrouped_nodes({name: node.op for name, node in graph.nodes.items()}, readers, (SUM_OPS, PRODUCT_OPS))
