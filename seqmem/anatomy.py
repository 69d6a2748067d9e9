"""Training-step anatomy: the loss, the forward and backward subgraphs, feature maps.

The backward pass is found by name: TensorFlow puts gradient ops under a
`gradient_tape/` (TF2 `GradientTape`) or `gradients/` (TF1 `tf.gradients`) name
scope. Everything downstream of those ops (optimizer updates included) is
backward. The loss is either given or found as described in `analyze_step`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from seqmem.errors import GraphError, NoBackwardPassError
from seqmem.ir.graph import Graph, TensorRef, view_source

__all__ = ["StepAnatomy", "analyze_step", "GRADIENT_SCOPE"]

GRADIENT_SCOPE = re.compile(r"(^|/)(gradient_tape|gradients(_\d+)?)/")
_FLOAT_DTYPES = frozenset({"bfloat16", "float16", "float32", "float64"})


@dataclass(frozen=True)
class StepAnatomy:
    """The parts of a training step.

    loss: the scalar the backward pass differentiates.
    forward: the loss's node and all its ancestors.
    backward: gradient-scope nodes and all their descendants, minus `forward`.
    feature_maps: tensors produced in `forward` and read in `backward`, excluding
    persistent memory (parameters, constants, inputs) and views of it; in
    topological order of their producers.
    """

    loss: TensorRef
    forward: frozenset[str]
    backward: frozenset[str]
    feature_maps: tuple[TensorRef, ...]


def analyze_step(graph: Graph, loss: str | TensorRef | None = None) -> StepAnatomy:
    """Split `graph` into forward and backward passes around its loss.

    loss: the loss tensor ("name" or "name:0"); found automatically when None:
    the input of the gradient seed when the seed is built from the loss
    (`OnesLike(loss)`, `Fill(Shape(loss), 1)`), otherwise the floating-point
    scalar outside the backward pass with the most ancestors.
    Raises NoBackwardPassError when the graph computes no gradients, GraphError
    when `loss` names no tensor of the graph.
    """
    gradient_nodes = [name for name in graph.nodes if GRADIENT_SCOPE.search(name)]
    if not gradient_nodes:
        raise NoBackwardPassError(
            "the graph has no backward pass (no op under a 'gradient_tape/' or 'gradients/' "
            "name scope); pass a training step that computes gradients, or name its loss with loss=..."
        )
    backward_all = frozenset(gradient_nodes) | graph.descendants(gradient_nodes)
    loss_ref = _resolve_loss(graph, loss, backward_all)
    forward = graph.ancestors([loss_ref.node]) | {loss_ref.node}
    backward = backward_all - forward
    return StepAnatomy(
        loss=loss_ref,
        forward=frozenset(forward),
        backward=frozenset(backward),
        feature_maps=_feature_maps(graph, forward, backward),
    )


def _resolve_loss(graph: Graph, loss: str | TensorRef | None, backward: frozenset[str]) -> TensorRef:
    if loss is not None:
        ref = TensorRef.parse(loss) if isinstance(loss, str) else loss
        if ref.node not in graph:
            raise GraphError(f"loss={loss!r} names no node of the graph; give the loss tensor's name, e.g. 'Mean:0'")
        graph.tensor(ref)
        return ref
    seeded = _loss_from_seed(graph, backward)
    if seeded is not None:
        return seeded
    candidates = [
        ref
        for ref in graph.tensors()
        if ref.node not in backward
        and not graph.node(ref.node).persistent
        and graph.tensor(ref).shape == ()
        and graph.tensor(ref).dtype in _FLOAT_DTYPES
    ]
    if not candidates:
        raise NoBackwardPassError(
            "could not find the loss: no floating-point scalar outside the backward pass; name it with loss=..."
        )
    position = {name: i for i, name in enumerate(graph.topological_order())}
    return max(candidates, key=lambda ref: (len(graph.ancestors([ref.node])), position[ref.node]))


def _loss_from_seed(graph: Graph, backward: frozenset[str]) -> TensorRef | None:
    """The loss when the gradient seed is computed from it (OnesLike or Fill(Shape))."""
    for name in graph.topological_order():
        if name not in backward:
            continue
        node = graph.node(name)
        if node.op == "OnesLike" and node.inputs and node.inputs[0].node not in backward:
            return node.inputs[0]
        if node.op == "Fill" and node.inputs:
            shape_node = graph.node(node.inputs[0].node)
            if shape_node.op == "Shape" and shape_node.inputs and shape_node.inputs[0].node not in backward:
                return shape_node.inputs[0]
    return None


def _feature_maps(graph: Graph, forward: set[str], backward: frozenset[str]) -> tuple[TensorRef, ...]:
    maps = []
    for name in graph.topological_order():
        if name not in forward:
            continue
        for index in range(len(graph.node(name).outputs)):
            ref = TensorRef(name, index)
            if _holds_activation(graph, ref) and any(c in backward for c in graph.consumers(ref)):
                maps.append(ref)
    return tuple(maps)


def _holds_activation(graph: Graph, ref: TensorRef) -> bool:
    """False for persistent tensors and views of them (e.g. ReadVariableOp of a variable)."""
    while True:
        node = graph.node(ref.node)
        if node.persistent or node.op == "ReadVariableOp":
            return False
        source = view_source(node, ref.index)
        if source is None:
            return True
        ref = source
