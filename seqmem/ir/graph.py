"""The graph IR: an immutable view of a dataflow graph, free of TensorFlow.

A `Graph` holds `Node`s in their original order. Each node reads tensors
(`TensorRef`: producer name and output index) and may wait on other nodes through
control edges. Every output carries a `TensorInfo` (dtype, static shape, size in
bytes, where known). Attributes and the function library are carried along as
opaque values so that the capture module can write the graph back unchanged.

Derived indices (consumers, topological order) are computed once at
construction; a graph is never mutated, so they cannot go stale. Rewrites build a
new `Graph` with `Graph.replace`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from seqmem.errors import GraphError
from seqmem.ir.op_tables import LOOP_BACK_OPS, LOOP_MERGE_OPS, VIEW_OPS, is_persistent_op

__all__ = ["Graph", "Node", "TensorInfo", "TensorRef", "loop_value_buffer", "view_source"]


class TensorRef(NamedTuple):
    """Output `index` of node `node` (a tuple, so hashing and comparing are cheap)."""

    node: str
    index: int = 0

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"

    @classmethod
    def parse(cls, text: str) -> "TensorRef":
        """Parse "name" or "name:3" (TensorFlow's spelling of a tensor)."""
        name, sep, index = text.rpartition(":")
        if sep and index.isdigit():
            return cls(name, int(index))
        return cls(text, 0)


@dataclass(frozen=True)
class TensorInfo:
    """Static facts about one tensor.

    shape: one entry per dimension, None where a dimension is unknown; the whole
    shape is None when even the rank is unknown.
    size_bytes: bytes the tensor occupies on the device, None when unknown
    (unknown shape, or a variant whose contents could not be sized).
    element_bytes: for a TensorList, the bytes of each element, a buffer of its
    own (the list holds size_bytes // element_bytes of them); None otherwise.
    passes_input: the index of the node's input that this output is, returned
    unchanged by a called function or a loop (`seqmem.edge.passthrough`): the
    two share one buffer. None otherwise.
    copies_input: the output of an op that usually shares its input's buffer is
    a copy, a buffer of its own (a read of a variable in copy-on-read mode,
    `seqmem.edge.copy_on_read`).
    handle_shape: for a resource handle, the shape of the variable behind it
    where TensorFlow knows it (a captured variable's handle); None otherwise.
    """

    dtype: str
    shape: tuple[int | None, ...] | None
    size_bytes: int | None
    element_bytes: int | None = None
    passes_input: int | None = None
    copies_input: bool = False
    handle_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Node:
    """One operation.

    resource_bytes: bytes of device memory owned by the resource this node stands
    for (a variable's buffer behind a handle); 0 for ordinary ops.
    constant_sizes: bytes of each constant the functions this node calls or loops
    over hold in device memory once instantiated, across steps
    (`seqmem.edge.folded_constants`); empty for other ops.
    folded: TensorFlow replaces this node with a constant it keeps, so its outputs
    stay on the device across steps (`seqmem.edge.folded_constants`).
    duplicate_of: the earlier node that computes what this one computes, which TensorFlow
    runs in its place as it runs the step as written (Grappler merges the two,
    `seqmem.edge.duplicates`); "" for most nodes. Rewritten steps keep both.
    attrs, extras: opaque values (TensorFlow protos) seqmem carries but does not read,
    except through the capture module.
    """

    name: str
    op: str
    inputs: tuple[TensorRef, ...] = ()
    control_inputs: tuple[str, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    device: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False)
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False)
    resource_bytes: int = 0
    constant_sizes: tuple[int, ...] = ()
    folded: bool = False
    duplicate_of: str = ""

    @property
    def persistent(self) -> bool:
        """Whether this node's outputs stay on the device across steps: parameters, constants, inputs and
        folded nodes."""
        return self.folded or is_persistent_op(self.op)


class Graph:
    """An immutable dataflow graph.

    Raises GraphError at construction when two nodes share a name, an input names
    a missing node or output, or a control edge names a missing node.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        *,
        outputs: Iterable[TensorRef] = (),
        library: Any = None,
        versions: Any = None,
    ) -> None:
        by_name: dict[str, Node] = {}
        for node in nodes:
            if node.name in by_name:
                raise GraphError(f"two nodes are named {node.name!r}; node names must be unique")
            by_name[node.name] = node
        self._nodes = MappingProxyType(by_name)
        self.outputs: tuple[TensorRef, ...] = tuple(outputs)
        self.library = library
        self.versions = versions
        self._index = {name: i for i, name in enumerate(by_name)}
        self._consumers, self._control_successors = self._link()
        self._topo: tuple[str, ...] | None = None

    # -- construction helpers -------------------------------------------------

    def _link(self) -> tuple[dict[TensorRef, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        consumers: dict[TensorRef, list[str]] = {}
        control_successors: dict[str, list[str]] = {}
        for node in self._nodes.values():
            for ref in node.inputs:
                self._check_ref(ref, f"input of {node.name!r}")
                consumers.setdefault(ref, []).append(node.name)
            for name in node.control_inputs:
                if name not in self._nodes:
                    raise GraphError(f"control input {name!r} of {node.name!r} is not a node of the graph")
                control_successors.setdefault(name, []).append(node.name)
        for ref in self.outputs:
            self._check_ref(ref, "graph output")
        return (
            {ref: tuple(names) for ref, names in consumers.items()},
            {name: tuple(names) for name, names in control_successors.items()},
        )

    def _check_ref(self, ref: TensorRef, role: str) -> None:
        producer = self._nodes.get(ref.node)
        if producer is None:
            raise GraphError(f"{role} {ref} names node {ref.node!r}, which is not in the graph")
        if producer.outputs and ref.index >= len(producer.outputs):
            raise GraphError(f"{role} {ref}: node {ref.node!r} has only {len(producer.outputs)} outputs")

    def replace(self, *, nodes: Iterable[Node] | None = None, outputs: Iterable[TensorRef] | None = None) -> "Graph":
        """A new graph with other nodes and/or outputs; the library is shared."""
        return Graph(
            self._nodes.values() if nodes is None else nodes,
            outputs=self.outputs if outputs is None else outputs,
            library=self.library,
            versions=self.versions,
        )

    # -- lookups --------------------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, Node]:
        """Nodes by name, in their original order."""
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def node(self, name: str) -> Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise GraphError(f"no node named {name!r} in the graph") from None

    def tensor(self, ref: TensorRef) -> TensorInfo:
        """Static facts about a tensor; GraphError if the graph has no such tensor."""
        node = self.node(ref.node)
        if ref.index >= len(node.outputs):
            raise GraphError(f"node {ref.node!r} has no output {ref.index}")
        return node.outputs[ref.index]

    def tensors(self) -> Iterable[TensorRef]:
        """Every output of every node, in node order."""
        for node in self._nodes.values():
            for index in range(len(node.outputs)):
                yield TensorRef(node.name, index)

    def consumers(self, ref: TensorRef) -> tuple[str, ...]:
        """Names of the nodes that read `ref`, once per reading input."""
        return self._consumers.get(ref, ())

    def successors(self, name: str) -> set[str]:
        """Nodes that read an output of `name` or wait on it through a control edge."""
        node = self.node(name)
        out = set(self._control_successors.get(name, ()))
        for index in range(len(node.outputs)):
            out.update(self._consumers.get(TensorRef(name, index), ()))
        return out

    def predecessors(self, name: str) -> set[str]:
        """Nodes `name` reads from or waits on."""
        node = self.node(name)
        result = {ref[0] for ref in node.inputs}  # ref[0] is ref.node; indexing is the faster path
        result.update(node.control_inputs)
        return result

    # -- order and reachability ----------------------------------------------

    def ordering_predecessors(self, name: str) -> tuple[str, ...]:
        """The nodes `name` waits on before it can run, in input order, once each: its inputs and
        control inputs, except a loop Merge's back edge (NextIteration)."""
        return tuple(dict.fromkeys(self._ordering_predecessors(self.node(name))))

    def _ordering_predecessors(self, node: Node) -> Iterable[str]:
        for ref in node.inputs:
            if node.op in LOOP_MERGE_OPS and self._nodes[ref.node].op in LOOP_BACK_OPS:
                continue
            yield ref.node
        yield from node.control_inputs

    def topological_order(self) -> tuple[str, ...]:
        """Node names such that every node comes after all it depends on.

        Ties are broken by the original node order, so the result is deterministic.
        TF1 loop back edges (NextIteration -> Merge) are ignored. Raises GraphError
        on a cycle.
        """
        if self._topo is not None:
            return self._topo
        names = list(self._nodes)
        pending = [0] * len(names)
        successors: list[list[int]] = [[] for _ in names]
        for i, node in enumerate(self._nodes.values()):
            for pred in self._ordering_predecessors(node):
                successors[self._index[pred]].append(i)
                pending[i] += 1
        ready = [i for i, count in enumerate(pending) if count == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(names[i])
            for j in successors[i]:
                pending[j] -= 1
                if pending[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(names):
            stuck = sorted(set(names) - set(order))[:5]
            raise GraphError(f"the graph has a cycle through {stuck}")
        self._topo = tuple(order)
        return self._topo

    def ancestors(self, names: Iterable[str]) -> frozenset[str]:
        """Every node some node in `names` transitively depends on (excluding `names`)."""
        return self._reach(names, self.predecessors)

    def descendants(self, names: Iterable[str]) -> frozenset[str]:
        """Every node that transitively depends on some node in `names` (excluding `names`)."""
        return self._reach(names, self.successors)

    def _reach(self, names: Iterable[str], step) -> frozenset[str]:
        start = list(names)
        for name in start:
            self.node(name)
        seen: set[str] = set()
        stack = list(start)
        while stack:
            for other in step(stack.pop()):
                if other not in seen:
                    seen.add(other)
                    stack.append(other)
        return frozenset(seen - set(start))

    def validate(self) -> None:
        """Raise GraphError unless the graph is acyclic and every edge resolves.

        Edge resolution is checked at construction; this adds the cycle check and
        returns None when the graph is well formed.
        """
        self.topological_order()

    def __repr__(self) -> str:
        return f"Graph({len(self._nodes)} nodes, {len(self.outputs)} outputs)"

    def __reduce__(self):
        return (_rebuild, (tuple(self._nodes.values()), self.outputs, self.library, self.versions))


def view_source(node: Node, index: int) -> TensorRef | None:
    """The input whose buffer output `index` of `node` shares, or None if it owns its buffer."""
    info = node.outputs[index] if index < len(node.outputs) else None
    if info is not None and info.passes_input is not None:
        return node.inputs[info.passes_input]
    if node.op not in VIEW_OPS or not node.inputs or (info is not None and info.copies_input):
        return None
    if node.op == "IdentityN":
        return node.inputs[index] if index < len(node.inputs) else None
    return node.inputs[0] if index == 0 else None


def loop_value_buffer(name: str, returned: Mapping[str, str], view_input: Callable[[str], str | None]) -> str:
    """The tensor whose buffer a value `name` of a loop body is, in whatever naming the body uses: followed back
    through views (`view_input`: a view's input, None for any other tensor) and, from a loop variable, to the
    value the previous iteration returned for it (`returned`, by loop variable)."""
    seen = set()
    while name not in seen:
        seen.add(name)
        following = returned.get(name) or view_input(name)
        if following is None:
            break
        name = following
    return name


def _rebuild(nodes, outputs, library, versions) -> Graph:
    """Unpickle a Graph (derived indices are recomputed)."""
    return Graph(nodes, outputs=outputs, library=library, versions=versions)

