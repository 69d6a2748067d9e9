"""A step's collectives: which nodes exchange tensors with other workers, and the step without them.

A worker of a `tf.distribute` step that runs out of memory aborts every
worker's collectives, and TensorFlow keeps them aborted until the processes
restart, so no worker can measure another plan afterwards. `local_graph_def`
gives calibration a graph it can run out of memory in alone: each all-reduce
replaced by the identity of its input, each all-gather by copies of its input
concatenated. The rest of the graph, its order and its buffers are the step's
own; an all-reduce's output is its input's buffer where TensorFlow can forward
it (`CollectiveReduceV2` forwards its input), a gather's output has the bytes
of the gathered tensor, and the collectives' own receive buffers are not there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Optional

from tensorflow.core.framework import attr_value_pb2, graph_pb2, types_pb2
from tensorflow.python.framework import tensor_util

from seqmem.edge import library
from seqmem.ir.op_tables import ALL_GATHER_OPS, ALL_REDUCE_OPS, COLLECTIVE_OPS

__all__ = ["collective_ops", "local_graph_def"]


def collective_ops(graph_def: graph_pb2.GraphDef) -> list[str]:
    """The names of `graph_def`'s nodes, its library functions' included, that run a collective."""
    nodes = [node.name for node in graph_def.node if node.op in COLLECTIVE_OPS]
    for function in graph_def.library.function:
        nodes += [f"{function.signature.name}/{node.name}" for node in function.node_def
                  if node.op in COLLECTIVE_OPS]
    return nodes


def local_graph_def(graph_def: graph_pb2.GraphDef) -> Optional[graph_pb2.GraphDef]:
    """A copy of `graph_def` in which every all-reduce (in its library functions too) is an `Identity` of
    its data input, and every all-gather the concatenation of as many copies of its data input as the group
    has workers (a `ConcatV2` along axis 0: the shape and bytes of the gathered tensor). Each keeps its
    control inputs; its group and instance keys and its ordering tokens, which pair collectives among
    workers, are dropped. None when the graph runs another collective (broadcast, all-to-all, reduce-scatter,
    NCCL), or gathers for a group whose size is not a constant. Edited library functions, and their callers,
    are copies under new names (`seqmem.edge.library.use_copies`)."""
    local = graph_pb2.GraphDef()
    local.CopyFrom(graph_def)
    edited = set()
    for function in [None, *local.library.function]:
        nodes = local.node if function is None else function.node_def
        replaced = [node.name for node in nodes if node.op in COLLECTIVE_OPS]
        if not replaced:
            continue
        if not all(_make_local(node, nodes, in_function=function is not None)
                   for node in list(nodes) if node.op in COLLECTIVE_OPS):
            return None
        if function is not None:
            edited.add(function.signature.name)
            _follow_output_names(function, replaced)
    if edited:  # the originals are in the runtime already, under their names
        digest = hashlib.blake2b(local.library.SerializeToString(deterministic=True), digest_size=4).hexdigest()
        library.use_copies(local, edited, f"_seqmem_local_{digest}")
    return local


def _make_local(node, nodes, in_function: bool) -> bool:
    """Turn the collective `node` (a NodeDef of `nodes`, a graph's or a function body's) into its local
    stand-in, in place, keeping its type attribute "T" and its control inputs; False, with `node` as it
    was, where it has none."""
    if node.op in ALL_REDUCE_OPS:
        op, inputs, attributes = "Identity", [node.input[0]], {}
    elif node.op in ALL_GATHER_OPS:
        if node.op == "CollectiveGather":
            size = node.attr["group_size"].i
        else:
            size = _constant({other.name: other for other in nodes}, node.input[1])
        if size is None:
            return False
        axis = nodes.add(name=f"{node.name}/seqmem_axis", op="Const")
        axis.attr["dtype"].type = types_pb2.DT_INT32
        axis.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(0, types_pb2.DT_INT32))
        axis_output = f"{axis.name}:output:0" if in_function else f"{axis.name}:0"
        op, inputs = "ConcatV2", [node.input[0]] * size + [axis_output]
        attributes = {"N": attr_value_pb2.AttrValue(i=size), "Tidx": attr_value_pb2.AttrValue(type=types_pb2.DT_INT32)}
    else:
        return False
    controls = [name for name in node.input if name.startswith("^")]
    dtype = attr_value_pb2.AttrValue()
    dtype.CopyFrom(node.attr["T"])
    node.op = op
    del node.input[:]
    node.input.extend([*inputs, *controls])
    node.ClearField("attr")
    node.attr["T"].CopyFrom(dtype)
    for name, value in attributes.items():
        node.attr[name].CopyFrom(value)
    return True


def _follow_output_names(function, replaced: Iterable[str]) -> None:
    """In `function`'s body and returns, read the `replaced` collectives' output (named "data") by the name
    their stand-ins give it ("output")."""
    replaced = set(replaced)

    def follow(source: str) -> str:
        name, _, index = source.partition(":data:")
        return f"{name}:output:{index}" if index and name in replaced else source

    for node in function.node_def:
        node.input[:] = [follow(source) for source in node.input]
    for key, value in list(function.ret.items()):
        function.ret[key] = follow(value)


def _constant(by_name, source: str) -> Optional[int]:
    """The integer a `Const` node of `by_name` gives at `source` (an input name: "node", "node:0" or, in a
    function body, "node:output:0"); None for anything else (a function's argument, a computed value)."""
    node = by_name.get(source.split(":")[0])
    if node is None or node.op != "Const":
        return None
    value = tensor_util.MakeNdarray(node.attr["value"].tensor)
    return int(value) if value.size == 1 else None
