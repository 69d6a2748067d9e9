"""Static shapes downstream of a TensorList stacked after a loop, with the list's length filled in.

A decoder's outputs leave its loop as a TensorArray, stacked into one tensor
(`TensorListStack`) whose leading dimension TensorFlow's shape inference does
not know: nothing tells it the loop's trip count. Every tensor computed from
it (the transposed logits, the cross-entropy's input, their gradients) then
has an unknown size, which the simulator would count as 0 bytes: several
copies of a decoder's [time, batch, vocabulary] logits.

`seqmem.edge.capture` knows such a list's length (its loop's trip count). Here
a copy of the step's GraphDef gets that length as each stack's `num_elements`
attribute and is imported again, so that TensorFlow's own shape inference
carries it downstream. The copy only informs shapes: the step that runs keeps
its stacks unchanged (a loop that stops early fills fewer elements). Imported
anew, variable reads lose the shapes their handles carried in the traced
graph, so a tensor's shape is the traced one refined by the copy's, never
replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

__all__ = ["stacked_shapes"]


def stacked_shapes(tf_graph: tf.Graph, graph_def: graph_pb2.GraphDef,
                   list_length: Callable[[tf.Tensor], Optional[int]]) -> dict[str, tf.TensorShape]:
    """Refined static shapes, by tensor name, of the tensors of `tf_graph` (whose GraphDef is `graph_def`)
    that a stack of known length makes more specific; empty when no stack's length is unknown to TensorFlow
    and known to `list_length` (elements a list tensor holds, None when unknown)."""
    lengths = {}
    for op in tf_graph.get_operations():
        if op.type == "TensorListStack" and op.get_attr("num_elements") < 0 and _leading_unknown(op.outputs[0]):
            length = list_length(op.inputs[0])
            if length is not None:
                lengths[op.name] = length
    if not lengths:
        return {}
    refined_def = graph_pb2.GraphDef()
    refined_def.CopyFrom(graph_def)
    for node in refined_def.node:
        if node.name in lengths:
            node.attr["num_elements"].i = lengths[node.name]
    refined = tf.Graph()
    with refined.as_default():
        tf.graph_util.import_graph_def(refined_def, name="")
    shapes = {}
    for op in tf_graph.get_operations():
        for tensor, other in zip(op.outputs, refined.get_operation_by_name(op.name).outputs):
            if tensor.shape.is_compatible_with(other.shape):
                merged = tensor.shape.merge_with(other.shape)
                if merged != tensor.shape:
                    shapes[tensor.name] = merged
    return shapes


def _leading_unknown(tensor: tf.Tensor) -> bool:
    return tensor.shape.rank is None or tensor.shape[0] is None
