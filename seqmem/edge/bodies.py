"""Bytes a loop's or a called function's body holds while it runs, which the simulator does not see.

The simulator treats a while loop and a function call as one node each: their
inputs and outputs (a loop's variables and lists, what a call returns) are live
while it runs. The body allocates more. An iteration of a loop holds its
intermediates (an attention step's [batch, time, units] scores and their
gradients, for instance). A called function holds its intermediates while it
runs: a Keras LSTM's backward function, its transposed gradients and the zeroed
lists it makes beside the lists it consumes. Per loop and per call,
`body_bytes` simulates the body once with exact tensor sizes and returns its
peak beyond what the node is charged anyway, charged to the node as scratch
(a conditional: its branch that holds most, each simulated as a call in the
executor's order, below):

    loop: peak live bytes of one iteration's own tensors
    call: peak live bytes of the body's own tensors and of the arguments it frees
          - bytes of those arguments and of what it returns

A loop runs one iteration after another (`optimize` bounds it so), each in the
executor's order, which the simulator follows (`sim.schedule.executor_order`,
static costs): the NMT step's gradient iteration adds each weight gradient to
its sum as it comes. A call's nodes run interleaved with the caller's after
inlining, in no order one body shows: its body runs in topological order. A
conditional's branch runs in the executor's order too: TensorFlow lowers the
conditional to switches, and its branch's nodes become ready together once the
predicate is known (a loss-scale optimizer's update branch computes every
gradient's product with the learning rate before any variable's update, as the
executor drains its queue). A step seqmem pins runs each of its own
conditionals' branches in `branch_order` instead (`seqmem.edge.pinned_bodies`),
which `body_memory` charges too.

A gradient loop's body is sized with the element shapes of the lists it pops
(`seqmem.edge.loop_swap.with_popped_shapes`), its masks' included: TensorFlow's
shape inference leaves them unknown in the body, and with them the size of what
the body computes from them (an attention decoder's [batch, time, units]
gradient that the masked scores' gradient leads to), and every body with the
shapes of the variables it reads (`seqmem.edge.variable_shapes`).

Leaving out the body's arguments (the node's inputs), its constants (held across
steps, charged to the node: `seqmem.edge.folded_constants`) and, for a loop,
elements it reads from or writes to a list (the list's buffers). What a call
returns (the node's outputs) is live for the whole call in the simulator, so
its body is charged only what its peak holds beyond them (at least 0). Loops
and calls nested in a body are charged the same way inside it, recursively.
One iteration is charged, as `optimize` runs loops (one iteration at a time); a
loop left to run iterations in parallel may hold more.

For each loop `body_memory` also gives the iteration as the simulator replays
it through its allocator model (`seqmem.sim.iteration.Iteration`): when each
of the body's buffers is allocated and freed in `iteration_order`, and when
each element it writes to a list is made (the step of the tensor it pushes),
for the loop output that list becomes.

An argument whose buffer only its call reads (`handed_over`) is not held for
the whole call: inlined, the call frees it once the last of its body's readers
ran. Such a body is simulated with the argument live from its start, and
charged, as a `seqmem.sim.calls.CallCharge`, the most any stretch of it holds
less the arguments freed before that stretch, which the simulator counts as the
call's inputs throughout (at least 0). A Keras LSTM's backward call frees the
incoming [batch, time, units] gradient once it has transposed it, before its
gradient loop. A list argument counts only where a loop of the body pops it: a
gradient call's saved activations, popped and freed element by element, all
freed by the loop's end (held whole until then). A list the body only reads may
hold elements another list holds too (a Keras RNN's unstacked inputs, pushed
again as its saved inputs and sized 0 there: `seqmem.edge.list_sizes`), freed
only as that list is popped: it is held for the whole call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from seqmem.analyze.critical_path import static_costs
from seqmem.edge import capture
from seqmem.edge.library import FunctionBodies, branches
from seqmem.edge.list_sizes import list_uses
from seqmem.edge.loop_swap import with_popped_shapes
from seqmem.edge.variable_shapes import with_variable_shapes
from seqmem.ir.graph import Graph, TensorRef, view_source
from seqmem.ir.op_tables import (FUNCTIONAL_COND_OPS, FUNCTIONAL_LOOP_OPS, FUNCTION_CALL_OPS, LIST_READ_OPS,
                                 LIST_WRITE_OPS)
from seqmem.sim.calls import CallCharge
from seqmem.sim.schedule import executor_order
from seqmem.sim.iteration import Iteration
from seqmem.sim.simulator import body_pieces, simulate

__all__ = ["body_bytes", "body_memory", "branch_order", "handed_over", "iteration_order", "sized_bodies"]

# Elements of a list are the list's buffers, which the loop node counts: what these ops read from a list
# (their output), and what `LIST_WRITE_OPS` write to one

# The op a handed-over argument of a called body is simulated as: none the op tables know, so an ordinary
# tensor, allocated before the body's first op and freed after its last reader
_HANDED_OVER_ARGUMENT = "HandedOverArgument"


def handed_over(graph: Graph) -> dict[str, dict[int, int]]:
    """For each function call of `graph` with such arguments, by node name: {input index: bytes} of the
    arguments whose buffer it alone reads (directly or through views of it; not persistent, no output of
    the graph), which its body may free."""
    outputs = set(graph.outputs)

    def alone(ref: TensorRef, reader: str) -> bool:
        while ref not in outputs and graph.consumers(ref) == (reader,):
            producer = graph.node(ref.node)
            if producer.persistent:
                return False
            source = view_source(producer, ref.index)
            if source is None:
                return True
            ref, reader = source, ref.node
        return False

    result: dict[str, dict[int, int]] = {}
    for name, node in graph.nodes.items():
        if node.op not in FUNCTION_CALL_OPS:
            continue
        for index, ref in enumerate(node.inputs):
            info = graph.tensor(ref)
            if info.size_bytes and node.inputs.count(ref) == 1 and alone(ref, name):
                result.setdefault(name, {})[index] = info.size_bytes
    return result


def sized_bodies(graph_def: graph_pb2.GraphDef,
                 variables: Mapping[str, tuple[int, ...]] = MappingProxyType({})) -> FunctionBodies:
    """The bodies of `graph_def`'s functions as this module sizes them: the gradient loops' pops shaped
    (`with_popped_shapes`) and the variables they read shaped (`variables`, by the name of the node that
    outputs the handle: `seqmem.edge.variable_shapes`)."""
    return FunctionBodies(with_variable_shapes(with_popped_shapes(graph_def), variables).library)


def body_bytes(graph_def: graph_pb2.GraphDef,
               handed: Mapping[str, Mapping[int, int]] = MappingProxyType({}),
               variables: Mapping[str, tuple[int, ...]] = MappingProxyType({})) -> dict[str, int]:
    """For each while loop and function call among `graph_def`'s own nodes, by node name: the bytes its body
    holds as the module docstring says (nodes whose function is not in the library are left out).
    handed: the arguments each call alone reads, as `handed_over` gives them; variables: as `sized_bodies`
    takes them."""
    return body_memory(graph_def, handed, variables)[0]


def body_memory(graph_def: graph_pb2.GraphDef, handed: Mapping[str, Mapping[int, int]] = MappingProxyType({}),
                variables: Mapping[str, tuple[int, ...]] = MappingProxyType({})
                ) -> tuple[dict[str, int], dict[str, Iteration], dict[str, CallCharge], dict[str, int]]:
    """`body_bytes`; the `Iteration` of each while loop among `graph_def`'s own nodes, by node name: the
    order its body allocates and frees its buffers in, which the simulator replays through its allocator
    model (`seqmem.sim.iteration`); and the `CallCharge` of each of its own calls whose body frees
    arguments, by node name: its charge for other sizes of those arguments (`seqmem.sim.loop_swaps`); and,
    by node name, the charge of each of its own conditionals whose branches hold other bytes in
    `branch_order`, as a pinned step runs them, than in the executor's order."""
    bodies = sized_bodies(graph_def, variables)
    measured: dict[tuple[str, bool, tuple[tuple[int, int], ...], str], int] = {}
    iterations: dict[str, Iteration] = {}
    calls: dict[tuple[str, tuple[tuple[int, int], ...]], CallCharge] = {}
    freeing: dict[str, tuple[str, tuple[tuple[int, int], ...]]] = {}  # own calls freeing arguments: their key
    pinned: dict[str, int] = {}  # own conditionals' charges with their branches pinned, where they differ

    def held(function: str, loop: bool, arguments: tuple[tuple[int, int], ...] = (), branch: str = "") -> int:
        """Bytes `function`'s body holds; branch: "" for a loop or call, else "executor" or "pinned"."""
        key = (function, loop, arguments, branch)
        if key not in measured:
            measured[key] = 0  # a body that (indirectly) runs itself is counted once
            body = bodies.get(function)
            nested = charged(op.node_def for op in body.get_operations())
            graph = capture.from_tf(body)
            parameters = [TensorRef.parse(t.name).node for t in body.inputs]
            if loop:
                measured[key], iterations[function] = _iteration_bytes(graph, nested, parameters)
            else:
                returned = [TensorRef.parse(t.name) for t in body.outputs]
                order = (branch_order(graph) if branch == "pinned" else executor_order(graph, static_costs(graph))
                         if branch else graph.topological_order())
                charge = _call_charge(graph, order, nested, returned, parameters, dict(arguments))
                measured[key], calls[function, arguments] = charge.bytes(dict(arguments).__getitem__), charge
        return measured[key]

    def freed_by(function: str, arguments: Mapping[int, int]) -> tuple[tuple[int, int], ...]:
        """The `arguments` of a call of `function` its body may free: a list only where the body pops it."""
        if not arguments:
            return ()
        body = bodies.get(function)
        popped = _popped_arguments(body, bodies)
        return tuple(sorted((index, size) for index, size in arguments.items()
                            if body.inputs[index].dtype != tf.variant or index in popped))

    def charged(nodes: Iterable[node_def_pb2.NodeDef], top: bool = False) -> dict[str, int]:
        result = {}
        for node in nodes:
            if node.op in FUNCTIONAL_COND_OPS:  # the branch that holds most
                names = [branch.name for branch in branches(node) if branch.name in bodies]
                if names:
                    result[node.name] = max(held(name, False, branch="executor") for name in names)
                    pinned_bytes = max(held(name, False, branch="pinned") for name in names) if top else None
                    if pinned_bytes is not None and pinned_bytes != result[node.name]:
                        pinned[node.name] = pinned_bytes
                continue
            key = "body" if node.op in FUNCTIONAL_LOOP_OPS else "f" if node.op in FUNCTION_CALL_OPS else None
            if key is not None and node.attr[key].func.name in bodies:
                function = node.attr[key].func.name
                arguments = freed_by(function, handed.get(node.name, {})) if top and key == "f" else ()
                result[node.name] = held(function, key == "body", arguments)
                if arguments:
                    freeing[node.name] = (function, arguments)
        return result

    charges = charged(graph_def.node, top=True)
    loops = {node.name: iterations[node.attr["body"].func.name] for node in graph_def.node
             if node.name in charges and node.op in FUNCTIONAL_LOOP_OPS and node.attr["body"].func.name in iterations}
    return charges, loops, {name: calls[key] for name, key in freeing.items() if key in calls}, pinned


def _popped_arguments(body: tf.Graph, bodies: FunctionBodies) -> set[int]:
    """Indices of `body`'s arguments that are lists a while loop of `body` pops (`TensorListPopBack`),
    followed through identities: a gradient call's saved activations, which its loop frees as it pops them."""
    popped = set()
    for index, argument in enumerate(body.inputs):
        if argument.dtype != tf.variant:
            continue
        reached = [argument]
        while reached:
            tensor = reached.pop()
            for consumer in tensor.consumers():
                if consumer.type in ("Identity", "Snapshot"):
                    reached.append(consumer.outputs[0])
                elif consumer.type in FUNCTIONAL_LOOP_OPS and _pops(consumer, tensor, bodies):
                    popped.add(index)
    return popped


def _pops(loop: tf.Operation, value: tf.Tensor, bodies: FunctionBodies) -> bool:
    """Whether `loop`'s body pops the list `value` it gets as a loop variable."""
    return any(t.name == value.name and list_uses(loop, index, bodies)[0] for index, t in enumerate(loop.inputs))


def iteration_order(body: Graph) -> tuple[str, ...]:
    """The order one iteration of a loop `body` runs in on one stream, as the simulator charges it: the
    executor's (`sim.schedule.executor_order`, static costs, list elements counted as 0 bytes). The order
    `seqmem.edge.pinned_bodies` pins a body to."""
    return _iteration(body)[1]


def _iteration(body: Graph) -> tuple[Graph, tuple[str, ...]]:
    """`body` with its list elements counted as 0 bytes, and `iteration_order` of it."""
    listed = {node.inputs[LIST_WRITE_OPS[node.op]] for node in body.nodes.values() if node.op in LIST_WRITE_OPS}
    listed |= {ref for ref in body.tensors() if body.node(ref.node).op in LIST_READ_OPS}
    body = _without(body, listed)
    return body, executor_order(body, static_costs(body))


def _iteration_bytes(body: Graph, nested: dict[str, int], parameters: list[str]) -> tuple[int, Iteration]:
    """Peak live bytes of a loop body's own tensors, list elements aside (`nested` bytes charged to its
    loops and calls), and its `Iteration`: its buffers' lifetimes in `iteration_order` (a nested body's
    bytes in pieces of about 1 MiB while it runs), and the steps that make the elements it writes to the
    lists it gets as `parameters` (node names, in the loop's order of inputs)."""
    listed, order = _iteration(body)
    trace = simulate(listed, order, scratch_bytes=nested)
    buffers = [(listed.tensor(owner).size_bytes or 0, first, last)
               for owner, (first, last) in trace.lifetimes.items() if not listed.node(owner.node).persistent]
    position = {name: step for step, name in enumerate(order)}
    for name, size in nested.items():
        buffers += [(piece, position[name], position[name]) for piece in body_pieces(size)]
    elements = []
    for name, node in listed.nodes.items():
        if node.op in LIST_WRITE_OPS:
            source = node.inputs[0]
            while view_source(listed.node(source.node), source.index) is not None:
                source = view_source(listed.node(source.node), source.index)
            if source.node in parameters:
                written = trace.buffer_of[node.inputs[LIST_WRITE_OPS[node.op]]]
                elements.append((parameters.index(source.node), trace.lifetimes[written][0]))
    timeline = trace.busiest()
    iteration = Iteration(len(order), tuple(b for b in buffers if b[0]), tuple(sorted(elements)))
    return timeline.peak_bytes - timeline.persistent_bytes, iteration


def branch_order(body: Graph) -> tuple[str, ...]:
    """The order a pinned step runs a conditional's branch `body` in (`seqmem.edge.pinned_bodies`): of the
    executor's and the branch's topological order (each node as soon as its inputs exist, in the order the
    branch lists its nodes), the one whose simulated peak is lower, the executor's on a tie."""
    orders = (executor_order(body, static_costs(body)), body.topological_order())
    return min(orders, key=lambda order: simulate(body, order).busiest().peak_bytes)


def _call_charge(body: Graph, order: tuple[str, ...], nested: dict[str, int], returned: list[TensorRef],
                 parameters: list[str], handed: dict[int, int]) -> CallCharge:
    """The `CallCharge` of a called function `body` run in `order` (node names), its `handed` arguments
    ({index among `parameters`, the argument nodes: bytes}) live from its start until their last reader ran
    (`nested` bytes charged to its loops and calls)."""
    owners = set()
    for ref in returned:
        while ref is not None and ref not in owners:
            owners.add(ref)
            ref = view_source(body.node(ref.node), ref.index)
    returned_bytes = sum(body.tensor(ref).size_bytes or 0 for ref in owners
                         if view_source(body.node(ref.node), ref.index) is None
                         and not body.node(ref.node).persistent)
    index_of = {parameters[index]: index for index in handed}
    if handed:
        body = body.replace(nodes=[
            dataclasses.replace(node, op=_HANDED_OVER_ARGUMENT, outputs=(
                dataclasses.replace(node.outputs[0], size_bytes=handed[index_of[name]]),)) if name in index_of
            else node for name, node in body.nodes.items()])
    trace = simulate(body, order, scratch_bytes=nested)
    live = trace.busiest().live_bytes
    last_read = {index: _last_step(trace.lifetimes.get(TensorRef(name, 0)), len(order))
                 for name, index in index_of.items()}
    peaks: dict[tuple[int, ...], int] = {}
    for step, live_bytes in enumerate(live):
        freed = tuple(sorted(index for index, last in last_read.items() if last < step))
        own = live_bytes - sum(handed[index] for index, last in last_read.items() if last >= step)
        peaks[freed] = max(peaks.get(freed, own), own)
    return CallCharge(tuple((own, freed) for freed, own in peaks.items()), returned_bytes)


def _last_step(lifetime: tuple[int, int] | None, steps: int) -> int:
    """The step after which a buffer of `lifetime` (`MemoryTrace.lifetimes`) is freed; `steps` where it
    outlives them."""
    return steps if lifetime is None or lifetime[1] < 0 else lifetime[1]


def _without(body: Graph, left_out: set[TensorRef]) -> Graph:
    """`body` with the tensors `left_out` counted as 0 bytes."""
    return body.replace(nodes=[dataclasses.replace(node, outputs=tuple(
        dataclasses.replace(info, size_bytes=0) if TensorRef(name, i) in left_out else info
        for i, info in enumerate(node.outputs))) for name, node in body.nodes.items()])


