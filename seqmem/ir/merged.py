"""The graph TensorFlow runs once Grappler has merged the computations a graph holds twice."""

from __future__ import annotations

import dataclasses

from seqmem.ir.graph import Graph, Node, TensorRef

__all__ = ["merged_duplicates"]


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
