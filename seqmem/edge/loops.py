"""Bound how many iterations of each while loop run at once (TensorFlow's `parallel_iterations`).

A loop runs up to `parallel_iterations` iterations at once (tf.while_loop: 10,
tfa's decoders and every gradient loop of theirs: 32). Each iteration in flight
holds its own temporaries, and a gradient loop pops its saved activations that
far ahead, so a loop's memory depends on the order the executor happens to pick.
Bounded at 1, iterations run one after another. Measured on the NMT step (tfa
decoder, T=50, batch 8, 256 units; emulated device, one stream, 8 steps): peaks
74.7-138.6 MB as traced, 72.5-73.8 MB with the decoder's loops at 1.

Loops are functional `While`/`StatelessWhile` nodes (TF1 frames: their `Enter`
nodes), in the graph or inside library functions (Keras' LSTM runs its loop in
a called function). A function that contains a loop to bound, or calls one that
does, is replaced by a copy named `<name>_seqmem_loops<N>` that every reference
follows: a function already registered under its own name cannot change.
"""

from __future__ import annotations

from collections.abc import Iterable

from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2

__all__ = ["bound_loops", "check_parallel_iterations", "loops_above"]

_LOOP_OPS = frozenset({"Enter", "RefEnter", "StatelessWhile", "While"})


def loops_above(graph_def: graph_pb2.GraphDef, parallel_iterations: int) -> list[str]:
    """Names of the loops in `graph_def` (graph, then library functions as `function/node`) that may
    run more than `parallel_iterations` iterations at once."""
    check_parallel_iterations(parallel_iterations)
    found = [n.name for n in _over(graph_def.node, parallel_iterations)]
    for function in graph_def.library.function:
        found += [f"{function.signature.name}/{n.name}" for n in _over(function.node_def, parallel_iterations)]
    return found


def bound_loops(graph_def: graph_pb2.GraphDef, parallel_iterations: int) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which every loop runs at most `parallel_iterations` iterations at once
    (loops already bounded lower keep their bound); functions renamed as the module docstring says.
    Raises ValueError unless `parallel_iterations` is a positive int."""
    check_parallel_iterations(parallel_iterations)
    bounded = graph_pb2.GraphDef()
    bounded.CopyFrom(graph_def)
    renamed = _functions_to_copy(bounded.library, parallel_iterations)
    for function in bounded.library.function:
        function.signature.name = renamed.get(function.signature.name, function.signature.name)
        _bound(function.node_def, parallel_iterations, renamed)
    for gradient in bounded.library.gradient:
        gradient.function_name = renamed.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = renamed.get(gradient.gradient_func, gradient.gradient_func)
    _bound(bounded.node, parallel_iterations, renamed)
    return bounded


def check_parallel_iterations(parallel_iterations: int) -> None:
    """Raise ValueError unless `parallel_iterations` is a positive int."""
    if isinstance(parallel_iterations, bool) or not isinstance(parallel_iterations, int) or parallel_iterations < 1:
        raise ValueError(f"parallel_iterations must be a positive int, got {parallel_iterations!r}")


def _over(nodes: Iterable[node_def_pb2.NodeDef], parallel_iterations: int) -> list[node_def_pb2.NodeDef]:
    return [n for n in nodes if n.op in _LOOP_OPS and n.attr["parallel_iterations"].i > parallel_iterations]


def _called(node: node_def_pb2.NodeDef) -> set[str]:
    """Functions `node` refers to: as its op, or in any function-valued attribute (a call's `f`, a loop's
    `body` and `cond`, a conditional's branches)."""
    names = {node.op}
    for value in node.attr.values():
        if value.HasField("func"):
            names.add(value.func.name)
        names.update(f.name for f in value.list.func)
    return names


def _functions_to_copy(library: function_pb2.FunctionDefLibrary, parallel_iterations: int) -> dict[str, str]:
    """{name: copy's name} of every function with a loop over the bound, directly or through what it calls."""
    calls = {f.signature.name: {name for n in f.node_def for name in _called(n)} for f in library.function}
    to_copy = {f.signature.name for f in library.function if _over(f.node_def, parallel_iterations)}
    grew = True
    while grew:
        callers = {name for name, called in calls.items() if called & to_copy} - to_copy
        to_copy |= callers
        grew = bool(callers)
    return {name: f"{name}_seqmem_loops{parallel_iterations}" for name in sorted(to_copy)}


def _bound(nodes: Iterable[node_def_pb2.NodeDef], parallel_iterations: int, renamed: dict[str, str]) -> None:
    """Bound the loops among `nodes` and point every reference to a renamed function at its copy."""
    for node in nodes:
        if node.op in _LOOP_OPS and node.attr["parallel_iterations"].i > parallel_iterations:
            node.attr["parallel_iterations"].i = parallel_iterations
        if node.op in renamed:
            node.op = renamed[node.op]
        for value in node.attr.values():
            if value.HasField("func") and value.func.name in renamed:
                value.func.name = renamed[value.func.name]
            for function in value.list.func:
                if function.name in renamed:
                    function.name = renamed[function.name]
