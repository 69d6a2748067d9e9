"""A vocabulary head in a captured training step, found and replaced by a blocked computation. Free of
TensorFlow.

A sequence model's loss projects features [rows, H] to logits [rows, V] and takes the sparse softmax
cross-entropy; its gradient scales the op's second output (softmax - one_hot, [rows, V], made in the forward
pass and kept for backward) by the losses' gradient and multiplies the result by the kernel and the
features. Around the turn from forward to backward the step holds two or three [rows, V] tensors at once,
which no swap can free: each is read right after it is made. As TensorFlow traces it (Keras' `Dense` on
[B, T, H] and `sparse_categorical_crossentropy(from_logits=True)`, or `tf.matmul` with a tied embedding and
`tf.nn.sparse_softmax_cross_entropy_with_logits`):

    features -> MatMul(kernel) [-> Reshape | Identity | BiasAdd(bias)]* -> SparseSoftmaxCrossEntropyWithLogits
    d_losses -> ExpandDims -> Mul(:1) [-> Reshape | Identity]* -> BiasAddGrad  (bias's gradient)
                                                              -> MatMul       (features' gradient)
                                                              -> MatMul       (kernel's gradient)

The projection may also be a batched product of features [..., H] by a kernel of rank 2 (`tf.matmul` of a
[B, T, H] tensor and a tied embedding: `BatchMatMulV2`); its gradients are then batched products summed
over the broadcast batch axes and reshaped (`Sum` -> `Reshape`), the kernel's by way of a [B, V, H] tensor.

`find_heads` recognizes it (each Reshape keeping the V elements of a row together), and says for every
cross-entropy it did not recognize which node broke the pattern. `splice` puts a blocked computation
in its place (`seqmem.edge.head_nodes` makes it: `seqmem.layers.softmax_loss`'s blocked losses and their
gradients, the logits recomputed a block of rows at a time in backward). The blocked gradients of the
kernel and the bias are sums over blocks: equal to the original up to float rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from seqmem.ir.graph import Graph, Node, TensorRef
from seqmem.ir.op_tables import SHAPE_OPS
from seqmem.ir.backward_views import BACKWARD_VIEW_SCOPE, SPLIT_VIEW_OPS

__all__ = ["HeadSearch", "VocabularyHead", "find_heads", "splice"]

_CROSS_ENTROPY = "SparseSoftmaxCrossEntropyWithLogits"
_ROW_VIEWS = frozenset(["Identity", "Reshape"])  # ops that pass a [.., V] tensor on, rows unchanged
_BATCH_MATMULS = frozenset(["BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"])  # their adj_x, adj_y transpose


@dataclass(frozen=True)
class VocabularyHead:
    """One recognized head: the tensors the blocked computation reads and those it replaces.

    loss: the cross-entropy node; features [rows, H], labels [rows], kernel ([H, V], or [V, H] where
    `transpose_kernel`), bias ([V] or None), d_losses: the losses' gradient [rows]. d_features,
    d_kernel, d_bias: the step's gradients the blocked ones replace (None where the step has none).
    nodes: the step's nodes the blocked computation replaces. projection: the forward MatMul.
    """

    loss: str
    projection: str
    features: TensorRef
    labels: TensorRef
    kernel: TensorRef
    transpose_kernel: bool
    bias: Optional[TensorRef]
    d_losses: TensorRef
    d_features: Optional[TensorRef]
    d_kernel: Optional[TensorRef]
    d_bias: Optional[TensorRef]
    nodes: frozenset[str]
    rows: int
    hidden: int
    vocabulary: int
    dtype: str

    @property
    def logits_bytes(self) -> int:
        """Bytes of one [rows, V] tensor of the head."""
        return self.rows * self.vocabulary * _dtype_bytes(self.dtype)

    def describe(self) -> str:
        kernel = f"[{self.vocabulary}, {self.hidden}] (tied, transposed)" if self.transpose_kernel else \
            f"[{self.hidden}, {self.vocabulary}]"
        return (f"{self.loss}: features [{self.rows}, {self.hidden}] @ kernel {kernel}"
                f"{' + bias' if self.bias is not None else ''}, logits {self.logits_bytes / 2 ** 20:.1f} MB")


@dataclass(frozen=True)
class HeadSearch:
    """The heads `find_heads` recognized, and for each cross-entropy it did not, why (one line each)."""

    heads: tuple[VocabularyHead, ...]
    unrecognized: tuple[str, ...]


class _Unrecognized(Exception):
    """The pattern broke at a node; the message says where and how."""


def find_heads(graph: Graph, backward: Iterable[str] = ()) -> HeadSearch:
    """Every projection -> sparse softmax cross-entropy head of `graph` with its gradient (see the module
    docstring). backward: the step's backward nodes; a cross-entropy among them (a gradient's own) is not
    a head."""
    backward = frozenset(backward)
    heads, unrecognized = [], []
    for node in graph.nodes.values():
        if node.name in backward:
            continue
        if node.op == "LogSoftmax" and any(graph.node(name).op == "GatherV2"
                                           for name in graph.consumers(TensorRef(node.name, 0))):
            unrecognized.append(f"{node.name}: a cross-entropy as TensorFlow computes it under op determinism "
                                f"(LogSoftmax, GatherV2), not the fused {_CROSS_ENTROPY} the blocked head replaces")
        if node.op != _CROSS_ENTROPY:
            continue
        try:
            heads.append(_head(graph, node))
        except _Unrecognized as why:
            unrecognized.append(f"{node.name}: {why}")
    return HeadSearch(tuple(heads), tuple(unrecognized))


def _head(graph: Graph, loss: Node) -> VocabularyHead:
    logits, labels = loss.inputs[0], loss.inputs[1]
    shape = graph.tensor(logits).shape
    if shape is None or len(shape) != 2 or None in shape:
        raise _Unrecognized(f"its logits {logits} have no static [rows, V] shape ({shape})")
    rows, vocabulary = shape
    forward = {loss.name}
    bias: Optional[TensorRef] = None
    bias_add = None
    ref = logits
    while True:  # up from the cross-entropy to the projection
        _only_read_by(graph, ref, forward, "its logits")
        node = graph.node(ref.node)
        forward.add(node.name)
        if node.op in _ROW_VIEWS or node.op == "BiasAdd":
            _keeps_rows(graph, node, ref, vocabulary)
        if node.op in _ROW_VIEWS:
            ref = node.inputs[0]
        elif node.op == "BiasAdd" and bias is None and _attr_s(node, "data_format", b"NHWC") == b"NHWC":
            bias, bias_add, ref = node.inputs[1], node, node.inputs[0]
        elif node.op == "MatMul" or node.op in _BATCH_MATMULS:
            projection = node
            break
        else:
            raise _Unrecognized(f"the logits come from {node.name} ({node.op}), not a MatMul, BiasAdd or Reshape")
    transposes_features, transpose_kernel = _transposes(projection)
    if transposes_features:
        raise _Unrecognized(f"the projection {projection.name} transposes its features")
    features, kernel = projection.inputs
    shape = graph.tensor(features).shape or ()
    hidden = shape[-1] if shape else None
    batched = projection.op in _BATCH_MATMULS
    if None in shape or not shape or math.prod(shape[:-1]) != rows or (len(shape) != 2 and not batched):
        raise _Unrecognized(f"the projection's features {features} are not [{rows}, H]"
                            f"{' (or [..., H] of as many rows)' if batched else ''}")
    if graph.tensor(kernel).shape != ((vocabulary, hidden) if transpose_kernel else (hidden, vocabulary)):
        raise _Unrecognized(f"the projection's kernel {kernel} is not [H, V] ([V, H] transposed)")
    dtype = graph.tensor(logits).dtype
    if graph.tensor(labels).shape != (rows,):
        raise _Unrecognized(f"its labels {labels} are not [{rows}]")
    gradient = _gradient(graph, loss, rows, vocabulary)
    d_logits, d_losses, gradient_nodes = gradient
    d_features = d_kernel = d_bias = None
    for ref in d_logits:
        for name in graph.consumers(ref):
            reader = graph.node(name)
            if name in gradient_nodes:
                continue
            if reader.op == "BiasAddGrad" and bias is not None and d_bias is None:
                d_bias = TensorRef(name, 0)
            elif reader.op == projection.op and d_features is None and _is_features_gradient(
                    reader, ref, kernel, transpose_kernel):
                d_features = _summed(graph, reader, features, gradient_nodes) if batched else TensorRef(name, 0)
            elif reader.op == projection.op and d_kernel is None and _is_kernel_gradient(
                    graph, reader, ref, features, transpose_kernel):
                d_kernel = _summed(graph, reader, kernel, gradient_nodes) if batched else TensorRef(name, 0)
                gradient_nodes.update(ref.node for ref in reader.inputs if _own_view(graph, ref, name))
            else:
                raise _Unrecognized(f"the logits' gradient {ref} is read by {name} ({reader.op}), not by the "
                                    f"projection's or the bias's gradient")
            gradient_nodes.add(name)
    if bias is not None and d_bias is None:
        raise _Unrecognized(f"the bias of {bias_add.name} has no gradient in the step")
    return VocabularyHead(loss.name, projection.name, features, labels, kernel, transpose_kernel, bias, d_losses,
                          d_features, d_kernel, d_bias, frozenset(forward | gradient_nodes), rows, hidden,
                          vocabulary, dtype)


def _gradient(graph: Graph, loss: Node, rows: int, vocabulary: int) -> tuple[list[TensorRef], TensorRef, set[str]]:
    """The logits' gradient as the step passes it on ([rows, V] tensors), the losses' gradient, and the
    nodes between: Mul(ExpandDims(d_losses), loss:1), then row views."""
    backprop = TensorRef(loss.name, 1)
    readers = graph.consumers(backprop)
    if len(readers) != 1 or graph.node(readers[0]).op != "Mul":
        raise _Unrecognized(f"its softmax gradient {backprop} is read by {', '.join(readers) or 'nothing'}, "
                            f"not by one Mul (the step computes no gradient of it, or another one)")
    scale = graph.node(readers[0])
    (expanded,) = [ref for ref in scale.inputs if ref != backprop] or [None]
    expand = None if expanded is None else graph.node(expanded.node)
    if expand is None or expand.op != "ExpandDims" or graph.tensor(expanded).shape != (rows, 1):
        raise _Unrecognized(f"{scale.name} does not scale the softmax gradient by the losses' gradient [{rows}, 1]")
    d_losses = expand.inputs[0]
    if graph.tensor(d_losses).shape != (rows,):
        raise _Unrecognized(f"the losses' gradient {d_losses} is not [{rows}]")
    nodes = {scale.name}
    if graph.consumers(expanded) == (scale.name,):
        nodes.add(expand.name)
    d_logits, pending = [], [TensorRef(scale.name, 0)]
    while pending:
        ref = pending.pop()
        d_logits.append(ref)
        for name in graph.consumers(ref):
            reader = graph.node(name)
            if reader.op in _ROW_VIEWS:
                _keeps_rows(graph, reader, TensorRef(name, 0), vocabulary)
                nodes.add(name)
                pending.append(TensorRef(name, 0))
            elif reader.op in SHAPE_OPS:
                raise _Unrecognized(f"the logits' gradient {ref} is read by {name} ({reader.op}): a dynamic shape")
    return d_logits, d_losses, nodes


def _only_read_by(graph: Graph, ref: TensorRef, readers: set[str], what: str) -> None:
    others = [name for name in graph.consumers(ref) if name not in readers]
    if others:
        raise _Unrecognized(f"{what} {ref} are also read by {others[0]} ({graph.node(others[0]).op})")


def _keeps_rows(graph: Graph, node: Node, ref: TensorRef, vocabulary: int) -> None:
    """Raises _Unrecognized unless `node`'s output `ref` and its first input hold rows of `vocabulary`."""
    for tensor in (ref, node.inputs[0]):
        shape = graph.tensor(tensor).shape
        if not shape or shape[-1] != vocabulary:
            raise _Unrecognized(f"{node.name} ({node.op}) does not keep rows of {vocabulary} ({tensor}: {shape})")


def _transposes(node: Node) -> tuple[bool, bool]:
    """Whether a MatMul (transpose_a, transpose_b) or a batched one (adj_x, adj_y) transposes each input."""
    keys = ("adj_x", "adj_y") if node.op in _BATCH_MATMULS else ("transpose_a", "transpose_b")
    return _attr_b(node, keys[0]), _attr_b(node, keys[1])


def _is_features_gradient(node: Node, d_logits: TensorRef, kernel: TensorRef, transpose_kernel: bool) -> bool:
    """(d_logits @ kernel^T) for a [H, V] kernel, (d_logits @ kernel) for a [V, H] one."""
    return node.inputs == (d_logits, kernel) and _transposes(node) == (False, not transpose_kernel)


def _is_kernel_gradient(graph: Graph, node: Node, d_logits: TensorRef, features: TensorRef,
                        transpose_kernel: bool) -> bool:
    """(features^T @ d_logits) for a [H, V] kernel, (d_logits^T @ features) for a [V, H] one; the features
    may be the reader's own copy of their view (`seqmem.ir.backward_views`)."""
    read = (node.inputs[1], node.inputs[0]) if transpose_kernel else node.inputs
    return read[1] == d_logits and _same_value(graph, read[0], features) and _transposes(node) == (True, False)


def _summed(graph: Graph, product: Node, operand: TensorRef, nodes: set[str]) -> TensorRef:
    """A batched product's gradient as the step passes it on: summed over the broadcast batch axes and
    reshaped to `operand`'s shape (`Sum` -> `Reshape`, added to `nodes`)."""
    chain, ref = [], TensorRef(product.name, 0)
    for op in ("Sum", "Reshape"):
        readers = graph.consumers(ref)
        if len(readers) != 1 or graph.node(readers[0]).op != op:
            raise _Unrecognized(f"the batched gradient {ref} is read by {', '.join(readers) or 'nothing'}, not by "
                                f"one {op} (the sum over the broadcast axes, reshaped)")
        chain.append(readers[0])
        ref = TensorRef(readers[0], 0)
    if graph.tensor(ref).shape != graph.tensor(operand).shape:
        raise _Unrecognized(f"the batched gradient {ref} does not have {operand}'s shape")
    nodes.update(chain)
    return ref


def _same_value(graph: Graph, ref: TensorRef, other: TensorRef) -> bool:
    """`ref` is `other`, or a backward reader's own copy of the view `other` (the same op over the same inputs)."""
    if ref == other:
        return True
    node, original = graph.node(ref.node), graph.node(other.node)
    return (node.name.startswith(BACKWARD_VIEW_SCOPE) and ref.index == other.index and node.op == original.op
            and node.inputs == original.inputs)


def _own_view(graph: Graph, ref: TensorRef, reader: str) -> bool:
    """`ref` is a backward reader's own view copy (`seqmem.ir.backward_views`) that only `reader` reads."""
    node = graph.node(ref.node)
    return (node.name.startswith(BACKWARD_VIEW_SCOPE) and node.op in SPLIT_VIEW_OPS
            and graph.successors(node.name) == {reader})


def _attr_b(node: Node, key: str) -> bool:
    value = node.attrs.get(key)
    return bool(value is not None and value.b)


def _attr_s(node: Node, key: str, default: bytes) -> bytes:
    value = node.attrs.get(key)
    return default if value is None or not value.s else value.s


def _dtype_bytes(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]


def splice(graph: Graph, head: VocabularyHead, nodes: Sequence[Node], replacements: Mapping[TensorRef, TensorRef]
           ) -> Graph:
    """`graph` with `head.nodes` removed and `nodes` added, every read of a key of `replacements` (the
    losses, the gradients) reading its value instead, and a control edge on a removed node moved to the
    node of what replaces the losses. Shape constants only the removed nodes read go too.
    Raises GraphError (from the new graph) where `nodes` read what the graph lacks."""
    removed = set(head.nodes) | _orphaned(graph, head.nodes)
    after_loss = replacements[TensorRef(head.loss, 0)].node
    kept = []
    for node in graph.nodes.values():
        if node.name in removed:
            continue
        inputs = tuple(replacements.get(ref, ref) for ref in node.inputs)
        controls = tuple(dict.fromkeys(after_loss if name in removed else name for name in node.control_inputs))
        if inputs != node.inputs or controls != node.control_inputs:
            node = dataclasses.replace(node, inputs=inputs, control_inputs=controls)
        kept.append(node)
    outputs = [replacements.get(ref, ref) for ref in graph.outputs]
    return graph.replace(nodes=kept + list(nodes), outputs=outputs)


def _orphaned(graph: Graph, removed: Iterable[str]) -> set[str]:
    """Constants (and shape computations over them) that only the `removed` nodes read."""
    gone, pending = set(removed), list(removed)
    orphans = set()
    while pending:
        for ref in graph.node(pending.pop()).inputs:
            producer = graph.node(ref.node)
            if producer.name in gone or not _is_shape_constant(graph, producer):
                continue
            if graph.successors(producer.name) <= gone and producer.name not in {r.node for r in graph.outputs}:
                gone.add(producer.name)
                orphans.add(producer.name)
                pending.append(producer.name)
    return orphans


def _is_shape_constant(graph: Graph, node: Node) -> bool:
    """A Const, or an op over constants only, holding a small int32/int64 tensor (a Reshape's shape)."""
    small = all(info.dtype in ("int32", "int64") and (info.size_bytes or 0) <= 64 for info in node.outputs)
    return small and bool(node.outputs) and not node.control_inputs and (
        node.op == "Const" or all(graph.node(ref.node).op == "Const" for ref in node.inputs))
