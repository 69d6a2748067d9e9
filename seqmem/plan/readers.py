"""Who reads a tensor when: the backward readers of its contents, the last reader of the original, how long
the device keeps it. Shared by the candidates and the simulator's view of a plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from seqmem.analyze.anatomy import StepAnatomy
from seqmem.ir.graph import Graph, TensorRef, view_source
from seqmem.ir.op_tables import SHAPE_OPS

__all__ = ["backward_content_readers", "kept_until", "last_early_reader"]


def _reads_contents_in_backward(graph: Graph, reader: str, anatomy: StepAnatomy) -> bool:
    """Backward readers that need the data (shape-only ops keep reading the original)."""
    return reader in anatomy.backward and graph.node(reader).op not in SHAPE_OPS


def backward_content_readers(graph: Graph, ref: TensorRef, anatomy: StepAnatomy,
                              position: Mapping[str, int]) -> tuple[str, ...]:
    """`ref`'s readers in backward that need its contents, once each, in the order they run."""
    return tuple(sorted((r for r in set(graph.consumers(ref)) if _reads_contents_in_backward(graph, r, anatomy)),
                        key=position.__getitem__))


def last_early_reader(graph: Graph, ref: TensorRef, late_readers: Sequence[str], position: Mapping[str, int]) -> str:
    """The last of `ref`'s readers that read the original, not the restored copy (its producer when none)."""
    readers = [r for r in graph.consumers(ref) if r not in late_readers]
    return max(readers, key=position.__getitem__) if readers else ref.node


def kept_until(graph: Graph, ref: TensorRef, position: Mapping[str, int]) -> float:
    """The last schedule position at which `ref`'s contents are still on the device (infinite for
    persistent tensors and graph outputs): its last reader's, since a buffer is overwritten in place only
    once no reader is left."""
    source = ref
    while (view := view_source(graph.node(source.node), source.index)) is not None:
        source = view
    if graph.node(source.node).persistent or ref in graph.outputs:
        return float("inf")
    readers = [position[r] for r in graph.consumers(ref) if graph.node(r).op not in SHAPE_OPS]
    return max(readers, default=-1)
