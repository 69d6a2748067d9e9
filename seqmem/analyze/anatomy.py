"""Training-step anatomy: the loss, the forward and backward subgraphs, feature maps.

Found by what the graph computes; name scopes are hints only. The backward pass
starts at the gradient seed, the tensor of ones a tape or `tf.gradients` starts
from (`Const` ones, `Fill(shape, 1)`, `OnesLike(loss)`, `Fill(Shape(loss), 1)`),
read only by gradient ops (ops under a `gradient_tape/` or `gradients/` scope:
the hint). Backward is everything the seed reaches, and the gradient-scope ops
read only by backward (shapes, zeros for a loop's unused outputs). Gradient-scope
ops that feed the forward pass stay forward: `while_v2` creates a forward loop's
gradient accumulators under the tape's scope and makes the forward loop fill them.

The losses are given, or read off the seeds: the `x` of `OnesLike(x)` or
`Fill(Shape(x), 1)`; for a constant seed, the forward ops that the ops reading
the seed differentiate (their scope names each: `gradient_tape/<op>/...`,
`gradients/<op>_grad/...`). A step has several losses where it differentiates
several scalars: two tapes (a GAN's generator and discriminator losses), a list
of targets (`tape.gradient([a, b], ...)`), or a sum of scalars (`a + b`: the
gradient of an add of two scalars is the seed itself, so the seed is read by
the gradients of the terms and the sum is not differentiated). The losses are
verified by computation: at least half of the tensors computed from the step's
data that the backward pass reads must be a loss or made by a loss's ancestors
(not all: a loop's gradient also reads zeros made for the loop's unused outputs,
an embedding's update the ids). Without such a hint (a root-scope loss's
gradient sits at `gradient_tape/` itself), the float scalar outside the backward
pass that covers the most of those tensors, then the one with the fewest
ancestors, and at least half of those any scored scalar covers (what none is
computed from, such as a sparse optimizer's unique ids, tells none apart). When
several seeds name no loss, `analyze_step` raises and asks for `loss=`; when the
scalars tie or none covers half, it plans for the one computed from the most of
the step and logs a warning that names it and asks for `loss=` if it is another.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Union

from seqmem.errors import GraphError, NoBackwardPassError
from seqmem.ir.graph import Graph, TensorRef, view_source

__all__ = ["StepAnatomy", "analyze_step", "GRADIENT_SCOPE", "LossNames"]

_log = logging.getLogger(__name__)

# how a caller names the losses: one tensor ("name" or "name:0", or a TensorRef), several, or None (found)
LossNames = Union[str, TensorRef, Sequence[Union[str, TensorRef]], None]

GRADIENT_SCOPE = re.compile(r"(^|/)(gradient_tape|gradients(_\d+)?)/")
_FLOAT_DTYPES = frozenset({"bfloat16", "float16", "float32", "float64"})
# the op a gradient op differentiates, from its scope: gradient_tape/<op>/..., gradients/<op>_grad/...
_DIFFERENTIATED = re.compile(r"^(?:.*/)?(?:gradient_tape|gradients(?:_\d+)?)/(?P<op>.+?)(?:_grad)?/[^/]+$")
_ONE_BITS = {19: 0x3C00, 14: 0x3F80}  # DT_HALF, DT_BFLOAT16: the bit pattern of 1.0
_CONTENT_FORMATS = {1: "f", 2: "d", 19: "e"}  # DT_FLOAT, DT_DOUBLE, DT_HALF
_SCORED_SCALARS = 32  # without a seed's hint, how many scalars (those with the most ancestors) are scored


@dataclass(frozen=True)
class StepAnatomy:
    """The parts of a training step.

    losses: the scalars the backward pass differentiates: one for most steps, several where it differentiates
    several (a sum, a list, two tapes: module docstring).
    forward: the losses' nodes and all their ancestors.
    backward: what the gradient seed reaches, and the gradient-scope nodes only it reads, minus `forward`.
    feature_maps: tensors produced in `forward` and read in `backward`, excluding
    persistent memory (parameters, constants, inputs) and views of it; in
    topological order of their producers.
    """

    losses: tuple[TensorRef, ...]
    forward: frozenset[str]
    backward: frozenset[str]
    feature_maps: tuple[TensorRef, ...]


def analyze_step(graph: Graph, loss: LossNames = None) -> StepAnatomy:
    """Split `graph` into forward and backward passes around its losses.

    loss: the loss tensor ("name" or "name:0") or a sequence of them; found from the gradient seeds when
    None (module docstring). Raises NoBackwardPassError when the graph computes no gradients, or when
    `loss` is None and the losses cannot be told apart (the message says why and asks for `loss=`);
    GraphError when `loss` names no tensor of the graph.
    """
    hints = frozenset(name for name in graph.nodes if GRADIENT_SCOPE.search(name))
    if not hints:
        raise NoBackwardPassError(
            "the graph has no backward pass (no op under a 'gradient_tape/' or 'gradients/' "
            "name scope); pass a training step that computes gradients, or name its loss with loss=..."
        )
    seeds = _gradient_seeds(graph, hints)
    if seeds:
        backward_all = _backward(graph, seeds, hints)
    else:  # a seed given by the caller (output_gradients): the scope names the backward pass
        backward_all = hints | graph.descendants(hints)
    losses = _given_losses(graph, loss) if loss is not None else _found_losses(graph, seeds, backward_all)
    nodes = [ref.node for ref in losses]
    forward = graph.ancestors(nodes) | set(nodes)
    backward = backward_all - forward
    return StepAnatomy(
        losses=losses,
        forward=frozenset(forward),
        backward=frozenset(backward),
        feature_maps=_feature_maps(graph, forward, backward),
    )


def _gradient_seeds(graph: Graph, hints: frozenset[str]) -> tuple[str, ...]:
    """Nodes that make a tensor of ones for gradient ops (in `hints`) alone to start from, in node order;
    of those, the ones no other reaches a superset of the graph from (a gradient's own constant one, such
    as the `y - 1` of a power's gradient, reaches part of what the seed reaches)."""
    ones = [name for name, node in graph.nodes.items() if node.outputs and node.outputs[0].dtype in _FLOAT_DTYPES
            and ((_seeded_from(graph, name) is not None and (name in hints or _read_only_by(graph, name, hints)))
                 or (name not in hints and _is_constant_one(graph, name) and _read_only_by(graph, name, hints)))]
    reached = {name: graph.descendants([name]) for name in ones}
    return tuple(name for i, name in enumerate(ones)  # of seeds reaching the same, the first
                 if not any(reached[name] < reached[other] or (j < i and reached[name] == reached[other])
                            for j, other in enumerate(ones) if other != name))


def _read_only_by(graph: Graph, name: str, readers: AbstractSet[str]) -> bool:
    consumers = [c for i in range(len(graph.node(name).outputs)) for c in graph.consumers(TensorRef(name, i))]
    return bool(consumers) and all(c in readers for c in consumers)


def _seeded_from(graph: Graph, name: str) -> TensorRef | None:
    """x for a seed `OnesLike(x)` or `Fill(Shape(x), 1)`, else None."""
    node = graph.node(name)
    if node.op == "OnesLike" and node.inputs:
        return node.inputs[0]
    if node.op == "Fill" and len(node.inputs) == 2:
        shape = graph.node(node.inputs[0].node)
        if shape.op == "Shape" and shape.inputs and _is_constant_one(graph, node.inputs[1].node):
            return shape.inputs[0]
    return None


def _is_constant_one(graph: Graph, name: str) -> bool:
    """Whether `name` is a float constant of ones: a `Const`, or a `Fill` of a constant shape with one."""
    node = graph.node(name)
    if node.op == "Fill" and len(node.inputs) == 2:
        return graph.node(node.inputs[0].node).op == "Const" and _is_constant_one(graph, node.inputs[1].node)
    if node.op != "Const":
        return False
    value = node.attrs.get("value")
    return value is None or _all_ones(value.tensor)  # a hand-built graph states no value: its Const is the seed


def _all_ones(tensor: Any) -> bool:
    """Whether a TensorProto of a float dtype holds ones only (read without TensorFlow)."""
    if tensor.dtype in _ONE_BITS:
        values = list(tensor.half_val)
        return bool(values) and all(v == _ONE_BITS[tensor.dtype] for v in values) and not tensor.tensor_content
    values = list(tensor.float_val) or list(tensor.double_val)
    if not values and tensor.tensor_content and tensor.dtype in _CONTENT_FORMATS:
        fmt = _CONTENT_FORMATS[tensor.dtype]
        values = [v for (v,) in struct.iter_unpack("<" + fmt, tensor.tensor_content)]
    return bool(values) and all(v == 1.0 for v in values)


def _backward(graph: Graph, seeds: tuple[str, ...], hints: frozenset[str]) -> frozenset[str]:
    """What the seeds reach, and the gradient-scope nodes whose outputs only that reads."""
    backward = set(seeds) | graph.descendants(seeds)
    for name in reversed(graph.topological_order()):
        if name in hints and name not in backward and _read_only_by(graph, name, backward):
            backward.add(name)
    return frozenset(backward)


def _given_losses(graph: Graph, loss: str | TensorRef | Sequence[str | TensorRef]) -> tuple[TensorRef, ...]:
    given = [loss] if isinstance(loss, (str, TensorRef)) else list(loss)
    if not given:
        raise GraphError("loss=() names no tensor; give the loss tensor's name, e.g. 'Mean:0', or leave it out")
    refs = []
    for name in given:
        ref = TensorRef.parse(name) if isinstance(name, str) else name
        if ref.node not in graph:
            raise GraphError(f"loss={name!r} names no node of the graph; give the loss tensor's name, e.g. 'Mean:0'")
        graph.tensor(ref)
        refs.append(ref)
    return tuple(dict.fromkeys(refs))


def _found_losses(graph: Graph, seeds: tuple[str, ...], backward: frozenset[str]) -> tuple[TensorRef, ...]:
    read = _activations_read(graph, backward)
    hinted = []
    for seed in seeds:
        seeded = _seeded_from(graph, seed)
        hinted += [seeded] if seeded is not None else _differentiated(graph, seed, backward)
    hinted = list(dict.fromkeys(hinted))
    if len(seeds) > 1 and not hinted:
        raise NoBackwardPassError(f"could not find the loss: the step starts {len(seeds)} gradient computations "
                                  "and none names what it differentiates; name the losses with loss=...")
    if hinted and 2 * len(frozenset().union(*(_covering(graph, ref, read) for ref in hinted))) >= len(read):
        return tuple(hinted)
    candidates = [ref for name in graph.topological_order() if name not in backward
                  and not graph.node(name).persistent for ref in _outputs(graph, name) if _is_float_scalar(graph, ref)]
    if not candidates:
        raise NoBackwardPassError("could not find the loss: no floating-point scalar outside the backward pass; "
                                  "name it with loss=..., e.g. loss='Mean:0' (a loss the step neither returns nor "
                                  "uses is not in its graph, as TensorFlow prunes it: return it from the step)")
    # The loss depends on nearly the whole forward pass: only the scalars with the most ancestors are scored
    # (a large step holds thousands of others: normalization constants, the optimizer's own scalars).
    ancestors = {ref: len(graph.ancestors([ref.node])) for ref in candidates}
    candidates = sorted(candidates, key=ancestors.__getitem__, reverse=True)[:_SCORED_SCALARS]
    # What no scored scalar is computed from tells none of them apart (an optimizer's own work on the data,
    # such as the unique indices of a sparse update): the loss must cover half of the rest.
    covering = {ref: _covering(graph, ref, read) for ref in candidates}
    read = frozenset().union(*covering.values())
    # the most of `read` covered, then the fewest ancestors: the loss, not what is computed from it
    score = {ref: (len(covering[ref]), -ancestors[ref]) for ref in candidates}
    ranked = sorted(candidates, key=score.__getitem__, reverse=True)
    if 2 * score[ranked[0]][0] >= len(read) > 0 and (len(ranked) == 1 or score[ranked[0]] != score[ranked[1]]):
        return (ranked[0],)
    # the scalar computed from the most of the step; of equals, the last to run
    position = {name: i for i, name in enumerate(graph.topological_order())}
    guess = max(candidates, key=lambda ref: (ancestors[ref], position[ref.node]))
    _log.warning("seqmem: the loss could not be told apart by what the gradient reads; planning for %s, the "
                 "scalar computed from the most of the step; pass loss=... if it is another", guess)
    return (guess,)


def _differentiated(graph: Graph, seed: str, backward: frozenset[str]) -> list[TensorRef]:
    """The float scalar outputs of the forward ops that the readers of a constant seed differentiate."""
    refs = []
    for reader in graph.consumers(TensorRef(seed, 0)):
        match = _DIFFERENTIATED.match(reader)
        if match and match["op"] in graph and match["op"] not in backward:
            refs += [ref for ref in _outputs(graph, match["op"]) if _is_float_scalar(graph, ref)]
    return refs


def _activations_read(graph: Graph, backward: frozenset[str]) -> frozenset[TensorRef]:
    """The tensors computed from the step's data that the backward pass reads from outside it (not
    persistent, not views of it): what the loss's gradient needs, and no optimizer's own scalars."""
    data = [name for name, node in graph.nodes.items() if node.op == "Placeholder"
            and node.outputs and node.outputs[0].dtype != "resource"]
    from_data = graph.descendants(data)
    return frozenset(ref for name in backward for ref in graph.node(name).inputs
                     if ref.node not in backward and ref.node in from_data and _holds_activation(graph, ref))


def _covering(graph: Graph, ref: TensorRef, read: frozenset[TensorRef]) -> frozenset[TensorRef]:
    """The tensors of `read` that are `ref` or made by one of its ancestors."""
    ancestors = graph.ancestors([ref.node])
    return frozenset(tensor for tensor in read if tensor == ref or tensor.node in ancestors)


def _outputs(graph: Graph, name: str) -> list[TensorRef]:
    return [TensorRef(name, i) for i in range(len(graph.node(name).outputs))]


def _is_float_scalar(graph: Graph, ref: TensorRef) -> bool:
    info = graph.tensor(ref)
    return info.shape == () and info.dtype in _FLOAT_DTYPES


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
