"""The nodes of a blocked vocabulary head, made by TensorFlow, for `seqmem.rewrite.vocabulary_head.splice`.

The blocked computation is `seqmem.layers.softmax_loss`'s (`blocked_losses` and `blocked_gradients`),
traced once for the head's shapes and dtypes: the forward nodes under `<scope>/`, the gradient's under
`gradient_tape/<scope>/` (they belong to the backward pass, as the step's own gradient nodes do).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from seqmem.edge import capture
from seqmem.ir.graph import Graph, Node, TensorRef
from seqmem.layers.softmax_loss import block_bounds, blocked_gradients, blocked_losses
from seqmem.rewrite.vocabulary_head import VocabularyHead, splice

__all__ = ["blocked_head"]


def blocked_head(graph: Graph, head: VocabularyHead, blocks: int, scope: str) -> Graph:
    """`graph` with `head` replaced by its blocked computation over `blocks` row blocks (at most one per
    row). Raises ValueError for a number of blocks below 1."""
    if blocks < 1:
        raise ValueError(f"blocks must be at least 1, got {blocks}")
    bounds = block_bounds(head.rows, blocks)
    device = graph.node(head.loss).device
    read = {"features": head.features, "labels": head.labels, "kernel": head.kernel, "bias": head.bias,
            "d_losses": head.d_losses}
    specs = {name: _spec(graph, ref) for name, ref in read.items() if ref is not None}

    shape = graph.tensor(head.features).shape  # [rows, H], or [..., H] for a batched projection

    def rows(features):
        return features if len(shape) == 2 else tf.reshape(features, [head.rows, head.hidden])

    def forward(features, labels, kernel, bias=None):
        return blocked_losses(rows(features), labels, [p for p in (kernel, bias) if p is not None], bounds,
                              transpose_kernel=head.transpose_kernel)

    def backward(features, labels, kernel, d_losses, bias=None):
        d_features, *d_parameters = blocked_gradients(
            rows(features), labels, [p for p in (kernel, bias) if p is not None], bounds, d_losses,
            transpose_kernel=head.transpose_kernel)
        return [tf.reshape(d_features, shape) if len(shape) != 2 else d_features, *d_parameters]

    forward_nodes, (losses,) = _traced(forward, specs, ("features", "labels", "kernel", "bias"), read, scope,
                                       device)
    backward_nodes, gradients = _traced(backward, specs, ("features", "labels", "kernel", "d_losses", "bias"), read,
                                        f"gradient_tape/{scope}", device)
    replaced = [TensorRef(head.loss, 0), head.d_features, head.d_kernel]
    if head.bias is not None:
        replaced.append(head.d_bias)
    replacements = {old: new for old, new in zip(replaced, (losses, *gradients)) if old is not None}
    return splice(graph, head, forward_nodes + backward_nodes, replacements)


def _spec(graph: Graph, ref: TensorRef) -> tf.TensorSpec:
    info = graph.tensor(ref)
    return tf.TensorSpec(info.shape, tf.as_dtype(info.dtype))


def _traced(function, specs: dict, arguments: tuple[str, ...], read: dict, scope: str, device: str
            ) -> tuple[list[Node], list[TensorRef]]:
    """`function` traced for the `specs` of its `arguments` (those present), as nodes renamed under `scope`
    that read the step's tensors (`read`) in place of the arguments; and its outputs."""
    names = [name for name in arguments if name in specs]
    traced = tf.function(function, autograph=False).get_concrete_function(**{name: specs[name] for name in names})
    small = capture.from_tf(traced)
    arguments_read = {}
    for node in small.nodes.values():
        if node.op == "Placeholder":
            arguments_read[node.name] = read[node.name]
    renamed = {name: f"{scope}/{name}" for name in small.nodes if name not in arguments_read}

    def moved(ref: TensorRef) -> TensorRef:
        return arguments_read[ref.node] if ref.node in arguments_read else TensorRef(renamed[ref.node], ref.index)

    nodes = []
    for node in small.nodes.values():
        if node.name in arguments_read:
            continue
        controls = tuple(arguments_read[name].node if name in arguments_read else renamed[name]
                         for name in node.control_inputs)
        nodes.append(dataclasses.replace(node, name=renamed[node.name], inputs=tuple(map(moved, node.inputs)),
                                         control_inputs=tuple(dict.fromkeys(controls)), device=device))
    return nodes, [moved(ref) for ref in small.outputs]
