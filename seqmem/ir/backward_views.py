"""Backward readers of a forward view get a view of their own. Free of TensorFlow.

A forward view (a `Reshape`, `ExpandDims`, `Squeeze` or `Identity`) shares its input's buffer. Where a
backward op reads the forward view itself, as `Tensordot`'s weight gradient reads the reshaped input of the
product (Keras' `Dense` on a [B, T, H] input), the buffer has two names read in backward, and a swap of one
would leave the other holding the original. So each such backward reader gets its own copy of the view,
made in the backward pass: it waits (control edges) for the reader's other inputs made in backward, so it
runs right before the reader, and a swap of the viewed tensor restores it for the copy as for any backward
reader. A view allocates nothing: the step computes what it computed, with the same memory where nothing
is swapped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from seqmem.ir.graph import Graph, Node, TensorRef

__all__ = ["BACKWARD_VIEW_SCOPE", "SPLIT_VIEW_OPS", "split_backward_views"]

BACKWARD_VIEW_SCOPE = "gradient_tape/seqmem_view"
SPLIT_VIEW_OPS = frozenset(["ExpandDims", "Identity", "Reshape", "Squeeze"])


def split_backward_views(graph: Graph, forward: Collection[str], backward: Collection[str]) -> Graph:
    """`graph` with each backward reader of a forward view of a non-persistent tensor reading its own copy
    of the view, named under `BACKWARD_VIEW_SCOPE`, after the reader's other inputs made in backward
    (see the module docstring). `graph` itself where there is none."""
    copies: list[Node] = []
    reads: dict[str, dict[TensorRef, TensorRef]] = {}  # by reader: the view it read -> its own copy
    for view in graph.nodes.values():
        if view.op not in SPLIT_VIEW_OPS or view.name not in forward or not view.inputs or len(view.outputs) != 1:
            continue
        if graph.node(view.inputs[0].node).persistent or view.outputs[0].copies_input:
            continue
        ref = TensorRef(view.name, 0)
        for number, reader in enumerate(dict.fromkeys(r for r in graph.consumers(ref) if r in backward)):
            after = tuple(dict.fromkeys(
                r.node for r in graph.node(reader).inputs if r.node in backward and r != ref))
            if not after:  # nothing to wait for: it would run with the forward view
                continue
            copy = dataclasses.replace(view, name=f"{BACKWARD_VIEW_SCOPE}/{view.name}/{number}",
                                       control_inputs=view.control_inputs + after)
            copies.append(copy)
            reads.setdefault(reader, {})[ref] = TensorRef(copy.name, 0)
    if not copies:
        return graph
    nodes = []
    for node in graph.nodes.values():
        own = reads.get(node.name)
        if own:
            node = dataclasses.replace(node, inputs=tuple(own.get(ref, ref) for ref in node.inputs))
        nodes.append(node)
    return graph.replace(nodes=nodes + copies)
