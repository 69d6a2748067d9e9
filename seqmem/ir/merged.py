"""The graph TensorFlow runs once Grappler has merged the computations a graph holds twice.

Where a merge changes values: Grappler's arithmetic optimizer sorts the data
inputs of a commutative op by name (`CanonicalizeNode`, utils/canonicalizer.cc),
and an `AddN` adds its inputs in that order. A sum of three or more terms that
reads a duplicate sorts the name of the node it was merged into in the
original; in a rewritten step, whose pinning control edges keep Grappler from
merging, it would sort the duplicate's own name and round otherwise (a GAN's
discriminator gradient: the two cross-entropies' gradients hold the same
product). `sums_read_merged` makes such sums read the merged node, in both.
"""

from __future__ import annotations

import dataclasses

from seqmem.ir.graph import Graph, Node, TensorRef

__all__ = ["merged_duplicates", "sums_read_merged"]

_SORTED_SUMS = frozenset(["AddN"])  # commutative ops of any number of inputs, each summed in its inputs' order


def merged_duplicates(graph: Graph) -> Graph:
    """`graph` without the nodes capture marked as duplicates (`Node.duplicate_of`), each reader of one
    reading the node it duplicates instead (a control input named once). `graph` itself where none is
    marked."""
    into = {name: node.duplicate_of for name, node in graph.nodes.items() if node.duplicate_of}
    if not into:
        return graph

    def reading(node: Node) -> Node:
        inputs = tuple(TensorRef(into.get(ref.node, ref.node), ref.index) for ref in node.inputs)
        controls = tuple(dict.fromkeys(into.get(name, name) for name in node.control_inputs))
        if inputs == node.inputs and controls == node.control_inputs:
            return node
        return dataclasses.replace(node, inputs=inputs, control_inputs=controls)

    return graph.replace(nodes=[reading(node) for name, node in graph.nodes.items() if name not in into])


def sums_read_merged(graph: Graph) -> Graph:
    """`graph` with each sum of three or more data inputs (`AddN`) that reads a node capture marked as a
    duplicate reading the node it duplicates instead (module docstring). `graph` itself where none does."""
    into = {name: node.duplicate_of for name, node in graph.nodes.items() if node.duplicate_of}
    nodes, changed = [], False
    for node in graph.nodes.values():
        if node.op in _SORTED_SUMS and len(node.inputs) >= 3 and any(ref.node in into for ref in node.inputs):
            node = dataclasses.replace(node, inputs=tuple(TensorRef(into.get(ref.node, ref.node), ref.index)
                                                          for ref in node.inputs))
            changed = True
        nodes.append(node)
    return graph.replace(nodes=nodes) if changed else graph
