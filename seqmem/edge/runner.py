"""Running a step's graph as TensorFlow holds it, rewritten or pruned, with the step's own inputs and variables.

A rewritten graph runs without Grappler's memory optimizer. Where TensorFlow
estimates a graph's peak above 80% of the device's memory as the device's
attributes state it (256 MB for a CPU device, whatever its allocator's limit),
that optimizer turns an `AddN` of more than two inputs live at that peak into a
temporary variable that each input is added to as it arrives (`SchedulingPass`,
memory_optimizer.cc):
the sum then depends on the order the executor runs their producers in, which
a pinned order changes by design, and its buffers are not the ones seqmem's
plan accounts for. Without it, every `AddN` sums its inputs in graph order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context

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
    if fetches is not None:
        wrapped = wrapped.prune(feeds=wrapped.inputs[:len(user_inputs)], fetches=wrapped.outputs)
    return _without_memory_optimizer(wrapped)


def _without_memory_optimizer(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, called with this thread's function options less Grappler's memory optimizer."""

    def call(*args: Any) -> Any:
        with _function_options_without_memory_optimizer():
            return function(*args)

    return call


@contextlib.contextmanager
def _function_options_without_memory_optimizer() -> Iterator[None]:
    ctx = context.context()
    options = ctx.function_call_options
    config = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    config.graph_options.rewrite_options.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    ctx.function_call_options = context.FunctionCallOptions(options.executor_type, config)
    try:
        yield
    finally:
        ctx.function_call_options = options
