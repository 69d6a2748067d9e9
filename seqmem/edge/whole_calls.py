"""Keep a pinned step's function calls whole: each runs as one node, not inlined into the step.

TensorFlow inlines a step's function calls before it runs the graph, and the
inlined body's nodes take none of the control edges that pin the caller's
order (`seqmem.swap.pin`): they run as soon as their inputs exist, interleaved
with the caller's nodes. The simulator runs a call as one node, where the
pinned order puts it, its body's own memory probed as the call's scratch.
Measured on the lstm example at batch 64 (its Keras LSTMs' forward and
backward passes are called functions; emulated 4096 MB device, one stream,
pinned to its own order with the gradient barriers split; 63.9 MB predicted):
inlined, the backward call's `gradients/zeros_like` and first transpose ran
before the dense layer's weight gradient, beside the 7.3 MB gradient of the
logits, and the step peaked at 69.2-71.1 MB; called whole, at 65.5-66.8 MB,
at the op the simulator predicts (docs/results.md, "Function calls kept
whole").

Each function the step's graph calls gets a copy `<name>_seqmem_whole` marked
`_noinline`, and every reference follows the copy (`seqmem.edge.library`: a
registered function cannot change under its own name). Functions called
inside it may still be inlined into its body.
"""

from __future__ import annotations

from collections.abc import Iterable

from tensorflow.core.framework import graph_pb2, node_def_pb2

from seqmem.edge import library
from seqmem.ir.op_tables import FUNCTION_CALL_OPS

__all__ = ["keep_calls_whole"]

_SUFFIX = "_seqmem_whole"


def keep_calls_whole(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` whose graph calls each function through a copy TensorFlow does not inline."""
    whole = graph_pb2.GraphDef()
    whole.CopyFrom(graph_def)
    called = _called(whole.node, {f.signature.name for f in whole.library.function})
    if not called:
        return whole
    renamed = library.copies_for(whole.library, called, _SUFFIX)
    library.rename_functions(whole.library, renamed)
    library.follow_copies(whole.node, renamed)
    kept_whole = {renamed[name] for name in called}
    for function in whole.library.function:
        if function.signature.name in kept_whole:
            function.attr["_noinline"].b = True
    return whole


def _called(nodes: Iterable[node_def_pb2.NodeDef], functions: set[str]) -> set[str]:
    """The library functions `nodes` call: through a call op's `f`, or as their op."""
    called = set()
    for node in nodes:
        if node.op in FUNCTION_CALL_OPS:
            called.add(node.attr["f"].func.name)
        elif node.op in functions:
            called.add(node.op)
    return called & functions
