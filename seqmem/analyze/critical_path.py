"""Timing analysis of a weighted dataflow graph (Meng et al.; Janssen et al.).

Every node has a cost in seconds. With unlimited parallelism a node starts when
its last predecessor completes (ASAP); `analyze_timing` returns start and
completion times, latest completion times that keep the makespan, slack, each
node's critical-path distance to the loss, and the critical path itself.

Costs come from one of two sources:
- `static_costs`: from shapes. Contractions (MatMul, BatchMatMul, Conv2D, Conv3D
  and their gradients) cost FLOPs / `MachineModel.flops_per_s`; every other op
  costs the bytes it reads and writes / `MachineModel.memory_bytes_per_s`.
- `measured_costs`: per-node times from a profiled run (see `seqmem.edge.op_trace`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from seqmem.ir.graph import Graph, Node, TensorRef

__all__ = [
    "EMULATED_DEVICE",
    "MachineModel",
    "Timing",
    "analyze_timing",
    "contraction_flops",
    "measured_costs",
    "static_costs",
    "transfer_time_s",
]


@dataclass(frozen=True)
class MachineModel:
    """The machine constants of the static cost model.

    flops_per_s: sustained floating-point operations per second of contractions
    (default: about what TF's Eigen kernels reach on 2 CPU cores).
    memory_bytes_per_s: sustained device-memory bandwidth of element-wise ops.
    host_bytes_per_s: bandwidth of a device<->host copy (swap-out/in).
    copies_overlap: copies run beside computation (a GPU's copy engine): a
    swap-in starts early enough to hide its transfer, and costs only what
    computation does not hide. False where they take the compute's own time (the
    emulated device serializes and parses on the cores that compute): a swap-in
    starts just before its first reader, and a swap costs its whole transfer,
    out and in.
    host_handle_bytes: device bytes a swapped tensor still holds there from its
    swap-out until its restore: 0 where the copy lives in host memory alone (a
    GPU's host copy); on the emulated device, the serialized copy's handle, a
    scalar tf.string in the arena. Few bytes, but one BFC chunk: where it lands
    decides which free chunks a later request splits or gets whole.
    """

    flops_per_s: float = 40e9
    memory_bytes_per_s: float = 8e9
    host_bytes_per_s: float = 6e9
    copies_overlap: bool = True
    host_handle_bytes: int = 0


EMULATED_DEVICE = MachineModel(copies_overlap=False, host_handle_bytes=24)  # sizeof(tstring)
"""This machine's emulated device: a swap is a SerializeTensor and a ParseTensor on the compute's own cores, so
copies do not overlap computation. The default rates are used for its copies; a round trip of tens of MB into
fresh host pages takes longer than they say."""


def transfer_time_s(size_bytes: int, machine: MachineModel) -> float:
    """Seconds to move `size_bytes` between device and host."""
    return size_bytes / machine.host_bytes_per_s


def _size(shape) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    return math.prod(shape)


def contraction_flops(graph: Graph, node: Node) -> float | None:
    """FLOPs of a contraction op (2 per multiply-add), None for other ops or unknown shapes."""
    shapes = [graph.tensor(ref).shape for ref in node.inputs]
    out = node.outputs[0].shape if node.outputs else None
    if node.op == "MatMul" and len(shapes) == 2:
        out_size, a_size = _size(out), _size(shapes[0])
        if out_size is None or a_size is None or not out or out[0] in (None, 0):
            return None
        inner = a_size // out[0]  # a is [M, K] or [K, M]; out is [M, N]
        return 2.0 * out_size * inner
    if node.op in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") and len(shapes) == 2:
        a = shapes[0]
        out_size = _size(out)
        if out_size is None or a is None or len(a) < 2 or _size(a[-2:]) is None or not out or out[-2] in (None, 0):
            return None
        inner = _size(a[-2:]) // out[-2]
        return 2.0 * out_size * inner
    if node.op in ("Conv2D", "Conv3D") and len(shapes) == 2:
        filter_shape = shapes[1]
        if filter_shape is None or _size(out) is None or _size(filter_shape[:-1]) is None:
            return None
        return 2.0 * _size(out) * _size(filter_shape[:-1])
    if node.op in ("Conv2DBackpropInput", "Conv3DBackpropInputV2") and len(shapes) == 3:
        filter_shape, grad = shapes[1], shapes[2]
        if filter_shape is None or _size(grad) is None or _size(filter_shape[:-1]) is None:
            return None
        return 2.0 * _size(grad) * _size(filter_shape[:-1])
    if node.op in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2") and len(shapes) == 3:
        grad = shapes[2]
        if out is None or _size(grad) is None or _size(out[:-1]) is None:
            return None
        return 2.0 * _size(grad) * _size(out[:-1])
    return None


def _bytes_moved(graph: Graph, node: Node) -> int:
    sizes = [graph.tensor(ref).size_bytes for ref in node.inputs]
    sizes += [info.size_bytes for info in node.outputs]
    return sum(size for size in sizes if size)


def static_costs(graph: Graph, machine: MachineModel = MachineModel()) -> dict[str, float]:
    """Estimated seconds per node from shapes alone (unknown sizes count as 0 bytes)."""
    costs = {}
    for name, node in graph.nodes.items():
        flops = contraction_flops(graph, node)
        if flops is not None:
            costs[name] = flops / machine.flops_per_s
        else:
            costs[name] = _bytes_moved(graph, node) / machine.memory_bytes_per_s
    return costs


def measured_costs(graph: Graph, op_time_s: Mapping[str, float], fallback_s: Mapping[str, float]) -> dict[str, float]:
    """Per-node seconds from a profiled run.

    op_time_s: seconds per executed op, keyed by node name (what the profiler reports).
    A node absent from the trace that Grappler fused into a traced consumer (its
    outputs are read by exactly one node, following such chains) gets the fused
    op's time; any other absent node gets its `fallback_s` estimate.
    """
    costs = {}
    for name, node in graph.nodes.items():
        if name in op_time_s:
            costs[name] = op_time_s[name]
            continue
        fused_into = _sole_consumer_chain_end(graph, node, op_time_s)
        costs[name] = op_time_s[fused_into] if fused_into is not None else fallback_s[name]
    return costs


def _sole_consumer_chain_end(graph: Graph, node: Node, op_time_s: Mapping[str, float]) -> str | None:
    seen = set()
    while node.name not in seen:
        seen.add(node.name)
        readers = {c for i in range(len(node.outputs)) for c in graph.consumers(TensorRef(node.name, i))}
        if len(readers) != 1:
            return None
        (reader,) = readers
        if reader in op_time_s:
            return reader
        node = graph.node(reader)
    return None


@dataclass(frozen=True)
class Timing:
    """Result of `analyze_timing`; all times in seconds from the start of the step.

    distance_to_loss_s: for the loss nodes and their ancestors, the length of the
    longest path from the node's completion to a loss's completion.
    critical_path: node names along the longest path through the whole graph.
    """

    cost_s: Mapping[str, float]
    start_s: Mapping[str, float]
    completion_s: Mapping[str, float]
    latest_completion_s: Mapping[str, float]
    slack_s: Mapping[str, float]
    distance_to_loss_s: Mapping[str, float]
    makespan_s: float
    critical_path: tuple[str, ...]


def analyze_timing(graph: Graph, cost_s: Mapping[str, float], loss_nodes: Collection[str] = ()) -> Timing:
    """ASAP schedule, slack and critical path of `graph` under `cost_s` (seconds per node).

    loss_nodes: `distance_to_loss_s` is filled for them and their ancestors.
    Raises GraphError on a cycle, ValueError when a node has no cost.
    """
    order = graph.topological_order()
    missing = [name for name in order if name not in cost_s]
    if missing:
        raise ValueError(f"no cost for {len(missing)} nodes, e.g. {missing[:3]}; give a cost for every node")
    preds = {name: graph.predecessors(name) for name in order}
    succs = {name: graph.successors(name) for name in order}
    start, completion, via = {}, {}, {}
    for name in order:
        ready, before = 0.0, None
        for pred in preds[name]:
            if pred in completion and completion[pred] > ready:
                ready, before = completion[pred], pred
        start[name] = ready
        completion[name] = ready + cost_s[name]
        via[name] = before
    makespan = max(completion.values(), default=0.0)
    latest = {}
    for name in reversed(order):
        later = [latest[s] - cost_s[s] for s in succs[name] if s in latest]
        latest[name] = min(later, default=makespan)
    slack = {name: latest[name] - completion[name] for name in order}

    path = []
    if completion:
        name = max(order, key=lambda n: completion[n])
        while name is not None:
            path.append(name)
            name = via[name]
    distance = _distance_to(graph, order, succs, cost_s, loss_nodes)
    return Timing(
        cost_s=dict(cost_s),
        start_s=start,
        completion_s=completion,
        latest_completion_s=latest,
        slack_s=slack,
        distance_to_loss_s=distance,
        makespan_s=makespan,
        critical_path=tuple(reversed(path)),
    )


def _distance_to(graph: Graph, order, succs, cost_s, targets: Collection[str]) -> dict[str, float]:
    """{target or ancestor of one: the longest path from its completion to a target's completion}."""
    members = graph.ancestors(targets) | set(targets)
    distance = {}
    for name in reversed(order):
        if name in members:
            distance[name] = max((cost_s[s] + distance[s] for s in succs[name] if s in distance), default=0.0)
    return distance
