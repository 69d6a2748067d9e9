"""A step's collectives: which nodes exchange tensors with other workers, and the step without them.

A worker of a `tf.distribute` step that runs out of memory aborts every
worker's collectives, and TensorFlow keeps them aborted until the processes
restart, so no worker can measure another plan afterwards. `local_graph_def`
gives calibration a graph it can run out of memory in alone: each all-reduce
replaced by the identity of its input. The rest of the graph, its order and
its buffers are the step's own; an all-reduce's output is its input's buffer
where TensorFlow can forward it (`CollectiveReduceV2` forwards its input), and
the reduction's own receive buffers are not there.
"""

from __future__ import annotations

from typing import Optional

from tensorflow.core.framework import attr_value_pb2, graph_pb2

__all__ = ["COLLECTIVE_OPS", "collective_ops", "local_graph_def"]

# ops that exchange tensors with other workers (tensorflow/core/ops/collective_ops.cc, nccl_ops.cc)
COLLECTIVE_OPS = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveReduceScatterV2",
    "CollectiveGather", "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastSendV2",
    "CollectiveBcastRecv", "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "NcclAllReduce", "NcclReduce", "NcclBroadcast",
})
# all-reduces: output 0 has the shape and type of input 0 (attribute "T")
_ALL_REDUCES = frozenset({"CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3"})


def collective_ops(graph_def: graph_pb2.GraphDef) -> list[str]:
    """The names of `graph_def`'s nodes, its library functions' included, that run a collective."""
    nodes = [node.name for node in graph_def.node if node.op in COLLECTIVE_OPS]
    for function in graph_def.library.function:
        nodes += [f"{function.signature.name}/{node.name}" for node in function.node_def
                  if node.op in COLLECTIVE_OPS]
    return nodes


def local_graph_def(graph_def: graph_pb2.GraphDef) -> Optional[graph_pb2.GraphDef]:
    """A copy of `graph_def` in which every all-reduce (in its library functions too) is an `Identity` of
    its data input and its control inputs (its group and instance keys, and its ordering tokens, which
    order collectives among workers, dropped). None when the graph runs another collective (gather, broadcast, all-to-all, NCCL), which has no local
    stand-in of the same shapes."""
    nodes = [*graph_def.node, *(node for function in graph_def.library.function for node in function.node_def)]
    if any(node.op in COLLECTIVE_OPS - _ALL_REDUCES for node in nodes):
        return None
    local = graph_pb2.GraphDef()
    local.CopyFrom(graph_def)
    for node in [*local.node, *(node for function in local.library.function for node in function.node_def)]:
        if node.op in _ALL_REDUCES:
            _make_identity(node)
    return local


def _make_identity(node) -> None:
    """Turn the all-reduce `node` (a NodeDef) into the Identity of its first input, in place."""
    data, *others = node.input
    controls = [name for name in others if name.startswith("^")]
    dtype = attr_value_pb2.AttrValue()
    dtype.CopyFrom(node.attr["T"])
    node.op = "Identity"
    del node.input[:]
    node.input.extend([data, *controls])
    node.ClearField("attr")
    node.attr["T"].CopyFrom(dtype)
