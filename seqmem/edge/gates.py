"""Start each while loop as a whole: once every input it reads exists.

TensorFlow lowers a functional While into a frame, one `Enter` node per loop
variable, and each `Enter` fires as soon as its own input exists. A gradient
loop whose forward lists are ready thus runs the part of its first iteration
that needs only them (zeroed gradient lists and their sums, one element per
time step) before the loss exists, inside the forward pass's peak. The
simulator runs a loop as one node, when all its inputs exist. A While's control
inputs gate every one of its `Enter` nodes (the `LoopControlInputs` NoOp of
TensorFlow's `lower_while_op.cc`), so a control edge from each node that makes
one of its inputs starts the loop as the simulator runs it.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from seqmem.ir.op_tables import FUNCTIONAL_LOOP_OPS

__all__ = ["gate_loops"]


def gate_loops(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each of its own while loops waits, by control edges, for every node
    that makes one of its inputs. Producers without inputs (placeholders, constants, variable handles)
    exist from the start and get no edge; loops inside library functions are left as they are."""
    gated = graph_pb2.GraphDef()
    gated.CopyFrom(graph_def)
    has_inputs = {node.name for node in gated.node if node.input}
    for node in gated.node:
        if node.op not in FUNCTIONAL_LOOP_OPS:
            continue
        waits_for = {name for name in node.input if name.startswith("^")}
        for name in list(node.input):
            producer = name.split(":")[0]
            if not name.startswith("^") and producer in has_inputs and f"^{producer}" not in waits_for:
                waits_for.add(f"^{producer}")
                node.input.append(f"^{producer}")
    return gated
