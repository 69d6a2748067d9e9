"""Bytes a loop's body holds while one iteration runs, which the simulator does not see.

The simulator treats a while loop as one node: its outputs (the loop variables,
the accumulators' lists) and its lists' inputs are live while it runs. An
iteration allocates more: the body's intermediates (an attention step's
[batch, time, units] scores and their gradients, for instance) and the body's
constants, which the kernels materialize. Per loop, `loop_body_bytes` simulates
the body function once, in topological order with exact tensor sizes, and
returns its peak beyond the loop variables, charged to the loop node as scratch:

    body bytes = peak live bytes of the body's own tensors + bytes of its constants

Leaving out what the loop node already counts: the body's arguments (the loop
variables), and elements read from or written to a list (the list's buffers).
Loops nested in a body are charged the same way inside it, recursively. One
iteration is charged, as `optimize` runs loops (one iteration at a time); a loop
left to run iterations in parallel may hold more.
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from seqmem.edge import capture
from seqmem.ir.graph import Graph, TensorRef
from seqmem.ir.op_tables import FUNCTIONAL_LOOP_OPS
from seqmem.sim.simulator import simulate

__all__ = ["loop_body_bytes"]

# Elements of a list are the list's buffers, which the loop node counts: what these ops read from a list
# (their output), and the input of these ops that they write to one (by op: its index)
_LIST_READ_OPS = frozenset({"TensorListPopBack", "TensorListGetItem"})
_LIST_WRITE_INPUT = {"TensorListPushBack": 1, "TensorListSetItem": 2}


def loop_body_bytes(graph_def: graph_pb2.GraphDef) -> dict[str, int]:
    """For each while loop of `graph_def`'s own nodes, by node name: the bytes one iteration of its body
    holds beyond the loop's variables (loops whose body is not in the library are left out)."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    measured: dict[str, int] = {}

    def body_bytes(name: str) -> int:
        if name not in measured:
            measured[name] = 0  # a body that (indirectly) runs itself is counted once
            body = function_def_to_graph(functions[name])
            nested = {op.name: body_bytes(op.get_attr("body").name) for op in body.get_operations()
                      if op.type in FUNCTIONAL_LOOP_OPS and op.get_attr("body").name in functions}
            measured[name] = _one_iteration_bytes(capture.from_tf(body), nested)
        return measured[name]

    return {node.name: body_bytes(node.attr["body"].func.name) for node in graph_def.node
            if node.op in FUNCTIONAL_LOOP_OPS and node.attr["body"].func.name in functions}


def _one_iteration_bytes(body: Graph, nested: dict[str, int]) -> int:
    """Peak live bytes of `body`'s own tensors (its nested loops charged `nested` bytes each) plus its
    constants' bytes."""
    constants = sum(info.size_bytes or 0 for node in body.nodes.values() if node.op == "Const"
                    for info in node.outputs)
    listed = {node.inputs[_LIST_WRITE_INPUT[node.op]] for node in body.nodes.values() if node.op in _LIST_WRITE_INPUT}
    listed |= {ref for ref in body.tensors() if body.node(ref.node).op in _LIST_READ_OPS}
    nodes = [dataclasses.replace(node, outputs=tuple(
                 dataclasses.replace(info, size_bytes=0) if TensorRef(name, i) in listed else info
                 for i, info in enumerate(node.outputs)))
             for name, node in body.nodes.items()]
    body = body.replace(nodes=nodes)
    timeline = simulate(body, body.topological_order(), scratch_bytes=nested).busiest()
    return timeline.peak_bytes - timeline.persistent_bytes + constants
