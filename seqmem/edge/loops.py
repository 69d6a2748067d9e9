"""Bound how many iterations of each while loop run at once (TensorFlow's `parallel_iterations`).

A loop runs up to `parallel_iterations` iterations at once (tf.while_loop: 10,
tfa's decoders and every gradient loop of theirs: 32). Each iteration in flight
holds its own temporaries, and a gradient loop pops its saved activations that
far ahead, so a loop's memory depends on the order the executor happens to pick.
Bounded at 1, iterations run one after another (`python -m models.nmt.loop_peaks`
measures a step's peaks both ways).

Loops are functional `While`/`StatelessWhile` nodes (TF1 frames: their `Enter`
nodes), in the graph or inside library functions (Keras' LSTM runs its loop in
a called function). A function that contains a loop to bound, or calls one that
does, is replaced by a copy named `<name>_seqmem_loops<N>` that every reference
follows: a function already registered under its own name cannot change.
"""

from __future__ import annotations

from collections.abc import Iterable

from tensorflow.core.framework import graph_pb2, node_def_pb2

from seqmem.edge import library
from seqmem.ir.op_tables import LOOP_BOUND_OPS

__all__ = ["bound_loops", "check_parallel_iterations", "loops_above"]



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
    with_loops = [f.signature.name for f in bounded.library.function if _over(f.node_def, parallel_iterations)]
    library.use_copies(bounded, with_loops, f"_seqmem_loops{parallel_iterations}")
    for function in bounded.library.function:
        _bound(function.node_def, parallel_iterations)
    _bound(bounded.node, parallel_iterations)
    return bounded


def check_parallel_iterations(parallel_iterations: int) -> None:
    """Raise ValueError unless `parallel_iterations` is a positive int."""
    if isinstance(parallel_iterations, bool) or not isinstance(parallel_iterations, int) or parallel_iterations < 1:
        raise ValueError(f"parallel_iterations must be a positive int, got {parallel_iterations!r}")


def _over(nodes: Iterable[node_def_pb2.NodeDef], parallel_iterations: int) -> list[node_def_pb2.NodeDef]:
    return [n for n in nodes if n.op in LOOP_BOUND_OPS and n.attr["parallel_iterations"].i > parallel_iterations]


def _bound(nodes: Iterable[node_def_pb2.NodeDef], parallel_iterations: int) -> None:
    for node in _over(nodes, parallel_iterations):
        node.attr["parallel_iterations"].i = parallel_iterations
