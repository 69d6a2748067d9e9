"""The graph IR: `Graph`, `Node`, `TensorRef`, `TensorInfo`, and the op tables. Free of TensorFlow."""

from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef, view_source

__all__ = ["Graph", "Node", "TensorInfo", "TensorRef", "view_source"]
