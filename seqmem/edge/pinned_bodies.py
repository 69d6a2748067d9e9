"""Pin the order of the functions a step runs: each node of a body waits for the one before it.

A pinned step chains its own nodes (`seqmem.swap.pin`), not those of its loop
bodies. There TensorFlow's executor runs a ready op inline or hands it to its
pool by a running average of the op's measured cycles (`KernelStats` in its
executor: expensive above 8000 cycles; the average of an op it runs inline is
still updated on about one run in 16), so ops that cost about that much switch
between the two from call to call. With them changes the order of an
iteration's independent ops, which of them frees a buffer first, and which free
chunks the requests after get: in the NMT step at batch 223 with every loop
list swapped, the order of the encoder's gradient body differed between calls
even after six warm-up calls.

Pinned, every node of each loop body (inline ones too: a reader that runs
earlier frees its input earlier) waits by a control edge for the node before it
in `seqmem.edge.bodies.iteration_order`, the order the simulator charges an
iteration for, so an iteration runs in that one order. So do the nodes of the
loop's condition and of every function the body or the condition calls (a
conditional's branches, calls; each chained on its own: the executor still
picks where a branch's nodes fall among the body's). The loop must run one
iteration at a time (`optimize`'s loop bound of 1): the chain orders an
iteration's nodes, not iterations.

Called functions (`pin_called_bodies`, for a step whose own nodes are pinned):
TensorFlow inlines a call before it runs the step, and then orders its body's
nodes by their data edges alone, interleaved with the caller's; the node after
a call waits only for the body's control outputs (its stateful nodes), where
the simulator runs a call as one node. So every function a call op runs,
outside loop bodies, runs its nodes in topological order, as the simulator
charges a call (`seqmem.edge.bodies`), each waiting for the one before it, and
every called function gets its last node as a control output, so that a
control edge from the call (`seqmem.swap.pin`) waits for the whole body. The
NMT step at batch 223 with every loop list swapped measured 225.5-227.7 MB in
four processes without, 219.9-222.0 MB in three with (docs/results.md, "Loop
outputs ready early, and called bodies pinned").

A function holding a pinned body, or calling one that does, is replaced by a
copy named `<name>_seqmem_pinned` that every reference follows: a function
already registered under its own name cannot change.
"""

from __future__ import annotations

from tensorflow.core.framework import function_pb2, graph_pb2

from seqmem.edge import capture, library
from seqmem.edge.bodies import iteration_order
from seqmem.edge.loop_swap import with_popped_shapes
from seqmem.ir.op_tables import FUNCTION_CALL_OPS, FUNCTIONAL_LOOP_OPS

__all__ = ["pin_called_bodies", "pin_loop_bodies"]

_SUFFIX = "_seqmem_pinned"
_LAST_NODE = "seqmem_pinned_last"  # the control output a called body's last node becomes


def pin_loop_bodies(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each function a while loop runs (its body and condition, in the graph
    or in a library function, and what they call) runs its nodes in `iteration_order`, each waiting by a
    control edge for the one before it; functions renamed as the module docstring says. Returns `graph_def`
    itself when it has no loop."""
    in_loops = _run_in_loops(graph_def)
    if not in_loops:
        return graph_def
    pinned = graph_pb2.GraphDef()
    pinned.CopyFrom(graph_def)
    bodies = library.FunctionBodies(with_popped_shapes(graph_def).library)
    edited = []
    for function in pinned.library.function:
        if function.signature.name in in_loops:
            order = iteration_order(capture.from_tf(bodies.get(function.signature.name)))
            if _chain(function, order):
                edited.append(function.signature.name)
    library.use_copies(pinned, edited, _SUFFIX)
    return pinned


def pin_called_bodies(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each function a call op runs (`FUNCTION_CALL_OPS`, in the graph or in a
    library function) that no while loop runs runs its nodes in topological order, each waiting by a control
    edge for the one before it, and in which every function a call op runs has its last node in that order
    as a control output; functions renamed as the module docstring says. Returns `graph_def` itself when it
    calls no function."""
    called = _called(graph_def)
    if not called:
        return graph_def
    pinned = graph_pb2.GraphDef()
    pinned.CopyFrom(graph_def)
    bodies = library.FunctionBodies(pinned.library)
    in_loops = _run_in_loops(graph_def)
    edited = []
    for function in pinned.library.function:
        name = function.signature.name
        if name not in called:
            continue
        order = capture.from_tf(bodies.get(name)).topological_order()
        chained = name not in in_loops and _chain(function, order)
        if _end_with(function, order) or chained:
            edited.append(name)
    library.use_copies(pinned, edited, _SUFFIX)
    return pinned


def _called(graph_def: graph_pb2.GraphDef) -> set[str]:
    """The library functions a call op of the graph or of its library runs."""
    nodes = [*graph_def.node, *(node for f in graph_def.library.function for node in f.node_def)]
    functions = {f.signature.name for f in graph_def.library.function}
    return {node.attr["f"].func.name for node in nodes if node.op in FUNCTION_CALL_OPS} & functions


def _end_with(function: function_pb2.FunctionDef, order: tuple[str, ...]) -> bool:
    """Make the last of `function`'s nodes in `order` a control output (in place); return whether the
    function changed."""
    names = {node.name for node in function.node_def}
    last = next((name for name in reversed(order) if name in names), None)
    if last is None or function.control_ret.get(_LAST_NODE) == last:
        return False
    if _LAST_NODE not in function.control_ret:
        function.signature.control_output.append(_LAST_NODE)
    function.control_ret[_LAST_NODE] = last
    return True


def _run_in_loops(graph_def: graph_pb2.GraphDef) -> set[str]:
    """The library functions a while loop runs each iteration: its body and condition, and every function
    they call (a conditional's branches, a call), transitively."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    nodes = [*graph_def.node, *(node for f in graph_def.library.function for node in f.node_def)]
    found = {node.attr[key].func.name for node in nodes if node.op in FUNCTIONAL_LOOP_OPS
             for key in ("body", "cond")} & set(functions)
    waiting = list(found)
    while waiting:
        for node in functions[waiting.pop()].node_def:
            for name in library.called_functions(node) & set(functions) - found:
                found.add(name)
                waiting.append(name)
    return found


def _chain(function: function_pb2.FunctionDef, order: tuple[str, ...]) -> bool:
    """Make each of `function`'s nodes wait for the one before it in `order` (in place), where no edge
    already orders the two; return whether any edge was added."""
    by_name = {node.name: node for node in function.node_def}
    chain = [name for name in order if name in by_name]
    added = False
    for before, after in zip(chain, chain[1:]):
        node = by_name[after]
        if before not in {name.lstrip("^").split(":")[0] for name in node.input}:
            node.input.append(f"^{before}")
            added = True
    return added
