"""Split the join that makes every gradient wait for the last one.

Keras' optimizers pass all gradients through one `IdentityN` before any update
(the forward of `tf.distribute`'s all-reduce, an identity without a
distribution strategy). `IdentityN` computes nothing, but it runs only once all
its inputs exist, so no variable's update can start, and no gradient can be
freed, until the backward pass has made the last gradient: every gradient is
held at once, next to the backward pass's own peak.

`split_barriers` lets each reader of such a node read the node's input
directly, and drops the node:

    before:  g1 --\                          after:  g1 ----> update 1
             g2 ---> IdentityN --> update 1          g2 ----> update 2
             g3 --/             \-> update 2         g3 ----> ...

Values are unchanged bit for bit: output i of `IdentityN` is input i's buffer.
A node that waited for the barrier by a control edge waits for every input's
producer instead; readers also inherit the barrier's own control inputs.
What changes is when updates may run: each right after its own gradient. An
update could then overwrite a weight that a later backward op still reads
through its forward `ReadVariableOp`; TensorFlow would copy the variable first
(copy on write: values stay right, but a copy of the weight is allocated). So
each variable writer also waits, by control edges, for every reader of the
variable's reads that does not depend on it: nothing is copied, and the
graph's values and memory stay what the simulator sees.
"""

from __future__ import annotations

import dataclasses

from seqmem.ir.graph import Graph, TensorRef, view_source
from seqmem.ir.op_tables import GRADIENT_BARRIER_OPS, writes_variable

__all__ = ["barrier_source", "gradient_barriers", "split_barriers"]

_MIN_INPUTS = 2  # a one-input IdentityN joins nothing


def gradient_barriers(graph: Graph) -> tuple[str, ...]:
    """Names of the nodes of `graph` that `split_barriers` can split: `IdentityN` nodes with two or more
    inputs, in graph order."""
    return tuple(name for name, node in graph.nodes.items()
                 if node.op in GRADIENT_BARRIER_OPS and len(node.inputs) >= _MIN_INPUTS)


def barrier_source(graph: Graph, ref: TensorRef, names: tuple[str, ...]) -> TensorRef:
    """The tensor `ref` is once the barriers `names` are split: `ref` itself unless a barrier makes it, else
    that barrier's matching input (output i of an `IdentityN` is its input i), through barriers that read
    barriers. A `tf.custom_gradient`'s outputs, a loss among them, pass through such an `IdentityN`."""
    while ref.node in names:
        ref = graph.node(ref.node).inputs[ref.index]
    return ref


def split_barriers(graph: Graph, names: tuple[str, ...]) -> Graph:
    """`graph` without the barrier nodes `names` (from `gradient_barriers`): each of their readers reads
    the barrier's input instead, and each node waiting on a barrier by a control edge waits for the
    producers of its inputs and its own control inputs. Each variable writer also waits for the readers
    of that variable's reads that do not depend on it (no copy on write). Raises ValueError for a name
    that is not such a barrier of `graph`."""
    if not names:
        return graph
    splittable = set(gradient_barriers(graph))
    unknown = [name for name in names if name not in splittable]
    if unknown:
        raise ValueError(f"not a barrier seqmem can split (an IdentityN with two or more inputs): {unknown}")
    barriers = {name: graph.node(name) for name in names}

    def source(ref: TensorRef) -> TensorRef:
        return barrier_source(graph, ref, names)

    def waits_for(name: str) -> tuple[str, ...]:
        if name not in barriers:
            return (name,)
        barrier = barriers[name]
        found = [source(ref).node for ref in barrier.inputs]
        for control in barrier.control_inputs:
            found.extend(waits_for(control))
        return tuple(dict.fromkeys(found))

    nodes = []
    for name, node in graph.nodes.items():
        if name in barriers:
            continue
        inputs = tuple(source(ref) for ref in node.inputs)
        controls = [c for control in node.control_inputs for c in waits_for(control)]
        for ref in node.inputs:
            if ref.node in barriers:
                controls.extend(c for control in barriers[ref.node].control_inputs for c in waits_for(control))
        controls = tuple(c for c in dict.fromkeys(controls) if c != name)
        if inputs != node.inputs or controls != node.control_inputs:
            node = dataclasses.replace(node, inputs=inputs, control_inputs=controls)
        nodes.append(node)
    return _writes_after_reads(graph.replace(nodes=nodes, outputs=[source(ref) for ref in graph.outputs]))


def _writes_after_reads(graph: Graph) -> Graph:
    """`graph` with each variable writer waiting for the readers of that variable's reads (through view ops)
    that do not depend on it."""
    readers_by_variable: dict[str, set[str]] = {}
    for name, node in graph.nodes.items():
        if node.op == "ReadVariableOp" and node.inputs:
            readers_by_variable.setdefault(node.inputs[0].node, set()).update(_readers(graph, TensorRef(name)))
    waits: dict[str, tuple[str, ...]] = {}
    position = {name: i for i, name in enumerate(graph.nodes)}
    for name, node in graph.nodes.items():
        if not writes_variable(node.op):
            continue
        handles = [ref.node for ref in node.inputs if graph.tensor(ref).dtype == "resource"]
        readers = set().union(*(readers_by_variable.get(handle, ()) for handle in handles))
        readers -= graph.predecessors(name) | {name}
        if readers:
            readers -= graph.descendants([name])
            waits[name] = tuple(sorted(readers, key=position.__getitem__))
    if not waits:
        return graph
    return graph.replace(nodes=[
        dataclasses.replace(node, control_inputs=node.control_inputs + waits[name]) if name in waits else node
        for name, node in graph.nodes.items()
    ])


def _readers(graph: Graph, ref: TensorRef) -> set[str]:
    """Nodes that read `ref`'s buffer: its consumers, and through view ops (Identity, ...) theirs."""
    found: set[str] = set()
    stack = [ref]
    while stack:
        current = stack.pop()
        for consumer in graph.consumers(current):
            found.add(consumer)
            node = graph.node(consumer)
            stack.extend(TensorRef(consumer, i) for i in range(len(node.outputs)) if view_source(node, i) == current)
    return found
