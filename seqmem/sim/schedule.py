"""The order in which the simulator runs a graph's nodes.

`schedule`: nodes by estimated start time (ASAP), for an executor that runs
independent ops at once. `executor_order`: the order TensorFlow's executor runs
a graph in with one inter-op thread (the emulated device's one compute stream).
`pinned_order`: the order it runs the graph in once `seqmem.swap.pin` has
chained the ASAP schedule's nodes with control edges.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from seqmem.critical_path import Timing
from seqmem.ir.graph import Graph
from seqmem.ir.op_tables import INLINE_OPS, TF1_CONTROL_FLOW_OPS

__all__ = ["INLINE_BELOW_S", "executor_order", "pinned_nodes", "pinned_order", "schedule"]

# TensorFlow's executor runs an op inline (on the thread that made it ready)
# once its running cost estimate is under 8000 CPU cycles (kernel_stats in
# executor.cc): about 3 microseconds on this class of CPU.
INLINE_BELOW_S = 3e-6


def schedule(graph: Graph, timing: Timing) -> tuple[str, ...]:
    """Execution order: nodes by estimated (ASAP) start time, ties broken topologically."""
    position = {name: i for i, name in enumerate(graph.topological_order())}
    return tuple(sorted(position, key=lambda name: (timing.start_s[name], position[name])))


def pinned_nodes(graph: Graph, order: Sequence[str]) -> tuple[str, ...]:
    """The nodes of `order` that a pinned step chains, in that order: all but `INLINE_OPS`."""
    return tuple(name for name in order if graph.node(name).op not in INLINE_OPS)


def pinned_order(graph: Graph, timing: Timing) -> tuple[str, ...]:
    """The order TensorFlow's executor runs `graph` in on one inter-op thread once its ASAP `schedule` is
    pinned: the chained nodes in schedule order, each inline node where the executor runs it.
    Empty for a graph with TF1 control flow, which cannot be pinned."""
    if any(node.op in TF1_CONTROL_FLOW_OPS for node in graph.nodes.values()):
        return ()
    return executor_order(graph, timing.cost_s, chain=pinned_nodes(graph, schedule(graph, timing)))


def executor_order(graph: Graph, cost_s: Mapping[str, float], inline_below_s: float = INLINE_BELOW_S,
                   chain: Sequence[str] = ()) -> tuple[str, ...]:
    """The order TensorFlow's executor runs `graph` in on one inter-op thread.

    Model of ExecutorState::Process and ScheduleReady (executor.cc): the thread
    drains a FIFO queue of inline nodes. When a node completes, the nodes it
    made ready are queued inline if inexpensive (cost under
    `inline_below_s` seconds, or an op whose kernel says so); of the expensive
    ones, the last is queued inline if the queue is empty and every other is
    handed to the thread pool. The pool's one thread takes the task handed to
    it last first (Eigen's run queue), and only once the inline queue is empty.
    The graph's roots are handed to the pool first, in graph order.

    The executor meets a node's readers in the order of the graph Grappler
    returns, which seqmem does not see; taking them in reverse graph order
    matched measured traces best (ResNet-14 at batch 128: 172 of 654 adjacent
    pairs out of order, against 209 in graph order).

    chain: nodes each of which also waits for the one before it (the control
    edges of a pinned step). Raises ValueError if those edges close a cycle.
    """
    names = list(graph.nodes)
    waiting = {}
    released_by: dict[str, list[str]] = {name: [] for name in names}
    for name in reversed(names):  # so each node's readers come in reverse graph order
        preds = graph.ordering_predecessors(name)
        waiting[name] = len(preds)
        for pred in preds:
            released_by[pred].append(name)
    for before, after in zip(chain, chain[1:]):
        waiting[after] += 1
        released_by[before].append(after)

    def inline(name: str) -> bool:
        return graph.node(name).op in INLINE_OPS or cost_s[name] < inline_below_s

    pool = deque(name for name in names if waiting[name] == 0)  # popped from the left
    order: list[str] = []
    while pool:
        queue = deque([pool.popleft()])
        while queue:
            name = queue.popleft()
            order.append(name)
            expensive = []
            for reader in released_by[name]:
                waiting[reader] -= 1
                if waiting[reader] == 0:
                    (queue if inline(reader) else expensive).append(reader)
            if expensive and not queue:
                queue.append(expensive.pop())
            pool.extendleft(expensive)
    if len(order) < len(names):
        raise ValueError("the chain contradicts the graph's edges: it is not in topological order")
    return tuple(order)
