"""Trip counts of a step's data-dependent while loops, measured by running what they need.

A loop whose condition compares its counter with a constant has a trip count
the graph states (`list_sizes.constant_trip_count`). A loop that runs until its
data says so (a tfa `BasicDecoder` without `maximum_iterations`, which stops
once every sequence is finished) does not: the lists it fills for its gradient
then have no size the graph states, and every tensor stacked from them has an
unknown leading dimension. `while_v2` returns the number of iterations it ran
as the loop's output 0 (its loop counter). Here the step's graph, pruned to
those counters, runs once on the step's arguments: only the ops the loops
need (the forward pass up to them), no variable update.

The counts hold for those arguments: a call whose data makes a loop run longer
holds more memory than the analysis predicts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from seqmem.edge import capture
from seqmem.edge.runner import graph_def_runner
from seqmem.runtime import stall_watch

__all__ = ["measured_trip_counts"]

_log = logging.getLogger(__name__)


def measured_trip_counts(function: capture.ConcreteFunction, loops: Sequence[str], args: Any) -> dict[str, int]:
    """Iterations each of `loops` (while loops of `function`'s own graph, `list_sizes.unbounded_loops`) ran on
    `args` (the step's arguments, structured as it takes them), by loop name. Empty when running them ran
    out of memory (logged)."""
    runner = graph_def_runner(function, function.graph.as_graph_def(), fetches=[f"{name}:0" for name in loops])
    try:
        with stall_watch.expected_idle():
            counts = runner(*tf.nest.flatten(args))
    except tf.errors.ResourceExhaustedError:
        _log.warning("seqmem: running the step's forward pass to count its loops' iterations ran out of memory; "
                     "the lists those loops fill are left unsized")
        return {}
    return {name: int(count) for name, count in zip(loops, counts)}
