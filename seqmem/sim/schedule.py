"""The order in which the simulator runs a graph's nodes.

`schedule`: nodes by estimated start time (ASAP), for an executor that runs
independent ops at once. `executor_order`: the order TensorFlow's executor runs
a graph in with one inter-op thread (the emulated device's one compute stream).
`deferred_schedule`: the ASAP schedule with what reads no step input moved to just
before its first reader (from variables: where only backward reads it; from constants
alone, such as a dropout's random mask: always). `pinned_order`: the order
TensorFlow runs the graph in once `seqmem.rewrite.pin` has chained the deferred
schedule's nodes with control edges. `measured_order`: the order a step was
seen running in (`seqmem.edge.op_trace`), where it could be run.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection, Mapping, Sequence

from seqmem.analyze.critical_path import Timing
from seqmem.ir.graph import Graph
from seqmem.ir.op_tables import INLINE_OPS, PERSISTENT_OPS, STEP_ARGUMENT_OPS, TF1_CONTROL_FLOW_OPS
from seqmem.ir.regrouped import regrouped_pairs

__all__ = ["INLINE_BELOW_S", "deferred_schedule", "executor_order", "measured_order", "pinned_nodes", "pinned_order", "schedule"]

# TensorFlow's executor runs an op inline (on the thread that made it ready)
# once its running cost estimate is under 8000 CPU cycles (kernel_stats in
# executor.cc): about 3 microseconds on this class of CPU.
INLINE_BELOW_S = 3e-6


def schedule(graph: Graph, timing: Timing) -> tuple[str, ...]:
    """Execution order: nodes by estimated (ASAP) start time, ties broken topologically."""
    position = {name: i for i, name in enumerate(graph.topological_order())}
    return tuple(sorted(position, key=lambda name: (timing.start_s[name], position[name])))


def deferred_schedule(graph: Graph, timing: Timing, loss_nodes: Collection[str] = ()) -> tuple[str, ...]:
    """`schedule`, except that each node reading none of the step's inputs, directly or not, comes right
    before its first reader instead of at the start, so that what it allocates is not held from the start
    of the step: where it reads only constants (a dropout's random mask of a static shape; TensorFlow draws
    a random op's values from its own seed, wherever it runs), and where it reads variables too and only
    what runs after the losses reads it (an optimizer's `momentum * slot`, read by the updates: descendants
    of `loss_nodes`). A node that reads a resource itself (a variable, a random generator's state) keeps its
    place among the forward's nodes. Without `loss_nodes`, the ASAP `schedule`."""
    order = schedule(graph, timing)
    if not loss_nodes:
        return order
    after_loss = graph.descendants(loss_nodes)
    inputs = [name for name, node in graph.nodes.items()
              if node.op in STEP_ARGUMENT_OPS and any(out.dtype != "resource" for out in node.outputs)]
    reads_inputs = graph.descendants(inputs) | set(inputs)
    reads_resources = {name for name, node in graph.nodes.items()
                       if any(graph.tensor(ref).dtype == "resource" for ref in node.inputs)}
    reads_variables = graph.descendants(reads_resources) | reads_resources
    key = {name: (i, 0) for i, name in enumerate(order)}  # sorted by (position, -depth before it)
    for name in reversed(graph.topological_order()):
        if name in reads_inputs or graph.node(name).op in PERSISTENT_OPS:
            continue
        readers = graph.successors(name)
        if readers and (name not in reads_variables or readers <= after_loss):
            position, depth = min((key[reader] for reader in readers), key=lambda k: (k[0], -k[1]))
            key[name] = (position, depth + 1)
    topological = {name: i for i, name in enumerate(graph.topological_order())}
    return tuple(sorted(order, key=lambda name: (key[name][0], -key[name][1], topological[name])))


def pinned_nodes(graph: Graph, order: Sequence[str]) -> tuple[str, ...]:
    """The nodes of `order` that a pinned step chains, in that order: those that allocate, which is all but
    `INLINE_OPS`, plus the variable reads that copy (`TensorInfo.copies_input`; left free, the executor
    would run such a read at the start of the step and hold its copy until its reader runs), less the
    sums and products Grappler regroups where no control edge touches them (`ir.regrouped`)."""
    regrouped = regrouped_pairs(graph)
    return tuple(name for name in order if name not in regrouped and (
        graph.node(name).op not in INLINE_OPS or any(info.copies_input for info in graph.node(name).outputs)))


def pinned_order(graph: Graph, timing: Timing, loss_nodes: Collection[str] = ()) -> tuple[str, ...]:
    """The order TensorFlow's executor runs `graph` in on one inter-op thread once its `deferred_schedule`
    (for `loss_nodes`) is pinned: the chained nodes in that order, each inline node where the executor runs it.
    Empty for a graph with TF1 control flow, which cannot be pinned."""
    if any(node.op in TF1_CONTROL_FLOW_OPS for node in graph.nodes.values()):
        return ()
    return executor_order(graph, timing.cost_s, chain=pinned_nodes(graph, deferred_schedule(graph, timing, loss_nodes)))


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
    returns, which seqmem does not see; it takes them in reverse graph order,
    which put fewer adjacent pairs of an allocation trace out of order than
    graph order did.

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


def measured_order(graph: Graph, started: Sequence[str]) -> tuple[str, ...]:
    """`graph`'s nodes in the order the step ran in: `started` lists node names in the order they started
    (`edge.op_trace.OpTrace.started`, on one inter-op thread). A node it lacks (Grappler folded or fused it
    away, or a function argument) comes right before the first node it leads to that it lists; names not
    in `graph` are ignored. Where `started` contradicts the graph's edges, the edges win: the result is
    always a topological order."""
    position = {name: i for i, name in enumerate(started)}
    topological = graph.topological_order()
    unlisted = len(position)  # after every listed node
    key = {}
    released_by: dict[str, list[str]] = {name: [] for name in topological}
    for name in reversed(topological):
        key[name] = position.get(name, min((key[reader] for reader in released_by[name]), default=unlisted))
        for pred in graph.ordering_predecessors(name):
            released_by[pred].append(name)
    waiting = {name: len(graph.ordering_predecessors(name)) for name in topological}
    rank = {name: i for i, name in enumerate(topological)}
    ready = [(key[name], rank[name], name) for name in topological if waiting[name] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)[2]
        order.append(name)
        for reader in released_by[name]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (key[reader], rank[reader], reader))
    return tuple(order)
