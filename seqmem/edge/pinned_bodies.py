"""Pin the order of every while loop's body, and of the step's conditionals' branches: each of their nodes
waits for the one before it.

A pinned step chains its own nodes (`seqmem.rewrite.pin`), not those of its loop
bodies. There TensorFlow's executor runs a ready op inline or hands it to its
pool by a running average of the op's measured cycles (`KernelStats` in its
executor: expensive above 8000 cycles; the average of an op it runs inline is
still updated on about one run in 16), so ops that cost about that much switch
between the two from call to call. With them changes the order of an
iteration's independent ops, which of them frees a buffer first, and which free
chunks the requests after get, in any call, however many calls warmed the step
up.

Pinned, every node of each loop body (inline ones too: a reader that runs
earlier frees its input earlier) waits by a control edge for the node before it
in `seqmem.edge.bodies.iteration_order`, the order the simulator charges an
iteration for, so an iteration runs in that one order. So do the nodes of the
loop's condition and of every function the body or the condition calls (a
conditional's branches, calls; each chained on its own: the executor still
picks where a branch's nodes fall among the body's). The loop must run one
iteration at a time (`optimize`'s loop bound of 1): the chain orders an
iteration's nodes, not iterations.

Left out of the chain are the nodes TensorFlow's graph optimizer rewrites in
the unpinned step, where a control edge would stop it (`left_to_grappler`):
identities, which it removes, and the trees of sums it regroups
(`seqmem.ir.regrouped`). Chained, a plan swapping some of the NMT
step's decoder lists summed a gradient iteration's terms in another order and
trained up to 4.5e-8 apart from the original.

A conditional of the step's own graph runs its branch's nodes when their
inputs exist, all at once once the predicate is known: a loss-scale optimizer's
update branch makes every gradient's product with the learning rate before it
updates the first variable. Pinned (`pin_branches`), each branch runs in
`seqmem.edge.bodies.branch_order`, the order the simulator charges a pinned
step's conditional for: the executor's or the branch's own, whichever holds
less. Branches a loop runs are left to `pin_loop_bodies`.

A function holding a pinned body, or calling one that does, is replaced by a
copy named `<name>_seqmem_pinned` that every reference follows: a function
already registered under its own name cannot change.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tensorflow.core.framework import function_pb2, graph_pb2

from seqmem.edge import capture, library
from seqmem.edge.bodies import branch_order, iteration_order, sized_bodies
from seqmem.ir.op_tables import FUNCTIONAL_COND_OPS, FUNCTIONAL_LOOP_OPS, REMOVED_IDENTITY_OPS, SUM_OPS
from seqmem.ir.regrouped import regrouped_nodes

__all__ = ["left_to_grappler", "pin_branches", "pin_loop_bodies"]

_SUFFIX = "_seqmem_pinned"


def pin_loop_bodies(graph_def: graph_pb2.GraphDef,
                    variables: Mapping[str, tuple[int, ...]] = MappingProxyType({})) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each function a while loop runs (its body and condition, in the graph
    or in a library function, and what they call) runs its nodes in `iteration_order`, each waiting by a
    control edge for the one before it; functions renamed as the module docstring says. The order is that
    of the bodies as `seqmem.edge.bodies` sizes them (`sized_bodies`, `variables` the shapes of the variables
    behind the graph's handles), so the one the simulator charges. Returns `graph_def` itself when it has no
    loop."""
    in_loops = _run_in_loops(graph_def)
    if not in_loops:
        return graph_def
    pinned = graph_pb2.GraphDef()
    pinned.CopyFrom(graph_def)
    bodies = sized_bodies(graph_def, variables)
    edited = []
    for function in pinned.library.function:
        if function.signature.name in in_loops:
            order = iteration_order(capture.from_tf(bodies.get(function.signature.name)))
            if _chain(function, order):
                edited.append(function.signature.name)
    library.use_copies(pinned, edited, _SUFFIX)
    return pinned


def pin_branches(graph_def: graph_pb2.GraphDef,
                 variables: Mapping[str, tuple[int, ...]] = MappingProxyType({})) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each branch of each conditional among its own nodes runs its nodes in
    `branch_order`, each waiting by a control edge for the one before it (branches a loop runs left out);
    functions renamed as the module docstring says. Bodies sized as `pin_loop_bodies` sizes them. Returns
    `graph_def` itself when it has no such branch."""
    in_loops = _run_in_loops(graph_def)
    names = {branch.name for node in graph_def.node if node.op in FUNCTIONAL_COND_OPS
             for branch in library.branches(node)} - in_loops
    if not names:
        return graph_def
    pinned = graph_pb2.GraphDef()
    pinned.CopyFrom(graph_def)
    bodies = sized_bodies(graph_def, variables)
    edited = [function.signature.name for function in pinned.library.function if function.signature.name in names
              and _chain(function, branch_order(capture.from_tf(bodies.get(function.signature.name))))]
    library.use_copies(pinned, edited, _SUFFIX)
    return pinned


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
    already orders the two, leaving out those `left_to_grappler` names; return whether any edge was
    added."""
    by_name = {node.name: node for node in function.node_def}
    left_out = left_to_grappler(function)
    chain = [name for name in order if name in by_name and name not in left_out]
    added = False
    for before, after in zip(chain, chain[1:]):
        node = by_name[after]
        if before not in {name.lstrip("^").split(":")[0] for name in node.input}:
            node.input.append(f"^{before}")
            added = True
    return added


def left_to_grappler(function: function_pb2.FunctionDef) -> set[str]:
    """The nodes of `function` a control edge would keep TensorFlow's graph optimizer from rewriting as it
    rewrites the unpinned step, changing what the step computes: its identities, which it removes (a sum's
    inputs are ordered by their names, and a removed identity's input has another), and the sums it
    regroups (`ir.regrouped`): summed in another order, the NMT step's gradient iteration no longer
    trained bit-identically."""
    readers: dict[str, list[str]] = {}
    for node in function.node_def:
        for name in node.input:
            if not name.startswith("^"):
                readers.setdefault(name.split(":")[0], []).append(node.name)
    regrouped = regrouped_nodes({node.name: node.op for node in function.node_def}, readers, (SUM_OPS,))
    return {node.name for node in function.node_def if node.op in REMOVED_IDENTITY_OPS} | regrouped
