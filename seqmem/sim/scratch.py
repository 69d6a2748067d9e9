"""Scratch memory a kernel allocates while it runs (freed when it returns): a static model.

Used where nothing can be measured (no emulated device or GPU); on a measuring
device `runtime.scratch_probe` measures every large op instead. Only the largest
known scratch is modelled:
- Conv2DBackpropFilter (after Conv2DCustomBackpropFilterOp): an im2col buffer of
  `shard` images x output pixels x filter size, the shard sized so one work
  unit set spans about 32 MiB of elements (a model of TF 2.15's kernel: on a
  measuring device the probe replaces it).
Other ops are taken to need none. `with_concurrent_scratch` adds the scratch of
ops the executor may run at the same time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from seqmem.analyze.critical_path import Timing
from seqmem.ir.graph import Graph, Node

__all__ = ["scratch_bytes_of", "static_scratch_bytes", "with_concurrent_scratch"]

_TARGET_WORKING_SET_ELEMENTS = (32 << 20) // 4


def scratch_bytes_of(graph: Graph, node: Node) -> int:
    """Bytes of scratch memory `node` holds while it runs; 0 when unmodelled or unknown."""
    if node.op == "Conv2DBackpropFilter" and len(node.inputs) == 3 and node.outputs:
        grad = graph.tensor(node.inputs[2])
        filter_shape = node.outputs[0].shape
        if grad.shape is None or filter_shape is None or None in grad.shape or None in filter_shape:
            return 0
        batch, out_rows, out_cols, out_depth = grad.shape
        element_bytes = grad.size_bytes // max(1, math.prod(grad.shape))
        image_size = out_rows * out_cols
        filter_size = math.prod(filter_shape[:3])
        work_unit = image_size * filter_size + image_size * out_depth + filter_size * out_depth
        shard = min(batch, -(-_TARGET_WORKING_SET_ELEMENTS // work_unit))
        return shard * image_size * filter_size * element_bytes
    return 0


def static_scratch_bytes(graph: Graph) -> dict[str, int]:
    """`scratch_bytes_of` every node that has some, by node name."""
    scratch = {name: scratch_bytes_of(graph, node) for name, node in graph.nodes.items()}
    return {name: size for name, size in scratch.items() if size}


def with_concurrent_scratch(
    scratch_bytes: Mapping[str, int], timing: Timing, inter_op_threads: int = 2
) -> dict[str, int]:
    """Scratch per node, plus that of the ops likely to run beside it.

    TensorFlow's executor runs up to `inter_op_threads` independent ops at once:
    a layer's input and filter gradients, for instance, start together and hold
    their scratch buffers at the same time. A node whose ASAP interval
    [start, completion) overlaps others' is charged, besides its own scratch, the
    largest scratch of up to `inter_op_threads - 1` of them.
    """
    if inter_op_threads < 1:
        raise ValueError(f"inter_op_threads must be at least 1, got {inter_op_threads}")
    names = sorted(scratch_bytes, key=lambda n: timing.start_s[n])
    result = dict(scratch_bytes)
    for name in names:
        start, end = timing.start_s[name], timing.completion_s[name]
        overlapping = sorted(
            (scratch_bytes[other] for other in names
             if other != name and timing.start_s[other] < max(end, start + 1e-12)
             and timing.completion_s[other] > start),
            reverse=True,
        )
        result[name] += sum(overlapping[: inter_op_threads - 1])
    return result
