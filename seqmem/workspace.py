"""Scratch memory a kernel allocates while it runs (freed when it returns).

Only kernels whose scratch is large enough to move a step's peak are modelled,
each after its TensorFlow 2.15 CPU implementation:
- Conv2DBackpropFilter (Conv2DCustomBackpropFilterOp): an im2col buffer of
  `shard` images x output pixels x filter size, where the shard is sized so one
  work unit set spans about 32 MiB of elements (conv_grad_filter_ops.cc).
Other ops are taken to need none.
"""

from __future__ import annotations

import math

from seqmem.graph import Graph, Node

__all__ = ["workspace_bytes"]

_TARGET_WORKING_SET_ELEMENTS = (32 << 20) // 4


def workspace_bytes(graph: Graph, node: Node) -> int:
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
