"""Running a step's graph as TensorFlow holds it, rewritten or pruned, with the step's own inputs and variables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem.edge import capture

__all__ = ["IMPORT_SCOPE", "graph_def_runner"]

IMPORT_SCOPE = "seqmem"  # `graph_def_runner` imports the graph under this name


def graph_def_runner(function: capture.ConcreteFunction, graph_def: graph_pb2.GraphDef,
                     fetches: Optional[Sequence[str]] = None):
    """A callable running `graph_def` (`function`'s graph, rewritten) with `function`'s flat inputs, its
    captures (variables) mapped in; it returns the flat outputs. fetches: tensor names of `graph_def` to
    return instead, the graph pruned to what they need (nothing else runs, variable updates included)."""
    captured = list(function.captured_inputs)
    placeholders = function.graph.inputs
    user_inputs = placeholders[: len(placeholders) - len(captured)]
    capture_names = [t.name for t in placeholders[len(user_inputs):]]
    output_names = [t.name for t in function.graph.outputs] if fetches is None else list(fetches)

    def body(*args):
        input_map = {t.name: arg for t, arg in zip(user_inputs, args)}
        graph = tf.compat.v1.get_default_graph()  # the wrap_function's FuncGraph
        input_map.update({name: graph.capture(value) for name, value in zip(capture_names, captured)})
        return tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=output_names,
                                              name=IMPORT_SCOPE)

    signature = [tf.TensorSpec(t.shape, t.dtype) for t in user_inputs]
    wrapped = tf.compat.v1.wrap_function(body, signature)
    if fetches is None:
        return wrapped
    return wrapped.prune(feeds=wrapped.inputs[:len(user_inputs)], fetches=wrapped.outputs)
