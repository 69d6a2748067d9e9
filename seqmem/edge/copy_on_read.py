"""Reads of variables that TensorFlow copies: variables in copy-on-read mode.

A `ReadVariableOp` usually returns the variable's own buffer. Once a sparse op
has touched a variable (an embedding's `ResourceGather`, an optimizer's
`ResourceScatterAdd` on its slots for IndexedSlices gradients), TensorFlow puts
the variable in copy-on-read mode (`EnsureSparseVariableAccess`,
`resource_variable_ops.cc`), and from then on every read allocates a copy (an
Adam update of an embedding reads the embedding and its two slots that way).
"""

from __future__ import annotations

import tensorflow as tf

from seqmem.edge.library import FunctionBodies
from seqmem.ir.op_tables import FUNCTION_CALL_OPS, SPARSE_OP_PREFIXES

__all__ = ["copying_reads"]


def copying_reads(tf_graph: tf.Graph, bodies: FunctionBodies) -> frozenset[str]:
    """Names of `tf_graph`'s own ReadVariableOps whose variable a sparse op reaches, in the graph or, through
    the call's arguments, in a function it calls (nested calls included): each returns a copy."""
    sparse = {op.inputs[0].ref() for op in tf_graph.get_operations()
              if op.type.startswith(SPARSE_OP_PREFIXES) and op.inputs}
    reached: dict[tuple[str, int], bool] = {}
    for op in tf_graph.get_operations():
        if op.type in FUNCTION_CALL_OPS:
            function = op.get_attr("f").name
            sparse |= {t.ref() for index, t in enumerate(op.inputs)
                       if t.dtype == tf.resource and _sparse_argument(function, index, bodies, reached)}
    return frozenset(op.name for op in tf_graph.get_operations()
                     if op.type == "ReadVariableOp" and op.inputs[0].ref() in sparse)


def _sparse_argument(function: str, index: int, bodies: FunctionBodies,
                     reached: dict[tuple[str, int], bool]) -> bool:
    """Whether argument `index` of `function` (a resource handle) reaches a sparse op."""
    if (function, index) not in reached:
        reached[function, index] = False  # a function that (indirectly) calls itself adds nothing
        body = bodies.get(function)
        if body is not None and index < len(body.inputs):
            handle = body.inputs[index]
            for consumer in handle.consumers():
                if consumer.type.startswith(SPARSE_OP_PREFIXES) or (
                        consumer.type in FUNCTION_CALL_OPS and any(
                            _sparse_argument(consumer.get_attr("f").name, i, bodies, reached)
                            for i, t in enumerate(consumer.inputs) if t is handle)):
                    reached[function, index] = True
                    break
    return reached[function, index]
