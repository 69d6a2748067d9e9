"""Swapped tensors a conditional reads, restored inside its branches, one at a time.

A conditional (`If`, `Case`) takes every tensor any branch reads as an input,
and TensorFlow starts a branch once those inputs exist: a loss-scale optimizer's
`tf.cond` over its finite check reads every gradient, so a gradient swapped out
and restored for it is back on the device, with all the others, before the
branch applies the first one. Restored inside the branch instead, each comes
back just before the branch reads it:

    before:  host copy -> restore -> If(..., g, ...)
    after:   host copy -> If(..., copy, ...)   branch: copy -> restore -> readers of g

The rewrite (`seqmem.rewrite.conservations`) marks the nodes that restore such
a tensor (`RESTORE_IN_BRANCH`): a chain from the host copy to the conditional's
input, made by the swap backend (`ParseTensor` and `EnsureShape` on the emulated
device, an `Identity` on the compute device otherwise, a cast back where the
copy is compressed). `restore_in_branches` moves each chain into every branch
that reads that input, which then takes the host copy as its argument, and makes
each moved chain wait, by control edges, for the nodes that depend on the one
restored before it in the branch's node order and on no other restored copy
(its update): one restored tensor at a time, as the simulator charges the
conditional (`sim.simulator`, `SwapEvent.in_branch`).
TensorFlow lowers the conditional into its branches' nodes before it runs, and
the control edges stay.

A conditional whose branches change gets copies of them, named
`<name>_seqmem_restores_<digest of the copy>`, which only it calls: a function
already registered under its own name cannot change, another node may call the
original, and a process holds every function a step registered, so the copies
another plan makes (calibration re-plans) must not take the first plan's names.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework import op_def_registry

from seqmem.edge.library import branches
from seqmem.ir.op_tables import FUNCTIONAL_COND_OPS

__all__ = ["RESTORE_IN_BRANCH", "restore_in_branches"]

RESTORE_IN_BRANCH = "_seqmem_restore_in_branch"  # bool attribute of the nodes a branch restores (module docstring)
_SUFFIX = "_seqmem_restores_"


def restore_in_branches(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which every chain of `RESTORE_IN_BRANCH` nodes feeding a conditional runs
    inside its branches (module docstring); `graph_def` itself where there is none. Raises ValueError
    where a marked node feeds anything but a conditional, or a chain has a node with other data inputs."""
    marked = {node.name: node for node in graph_def.node if _marked(node)}
    if not marked:
        return graph_def
    rewritten = graph_pb2.GraphDef()
    rewritten.CopyFrom(graph_def)
    functions = {f.signature.name: f for f in rewritten.library.function}
    moved = set()
    for node in (n for n in rewritten.node if n.op in FUNCTIONAL_COND_OPS):
        chains = {index: _chain(marked, name) for index, name in enumerate(node.input)
                  if index > 0 and not name.startswith("^") and name.split(":")[0] in marked}
        if not chains:
            continue
        for branch in branches(node):
            copy = rewritten.library.function.add()
            copy.CopyFrom(functions[branch.name])
            _restore_in(copy, {index - 1: chain for index, chain in chains.items()})
            digest = hashlib.blake2b(copy.SerializeToString(deterministic=True), digest_size=5).hexdigest()
            copy.signature.name = f"{branch.name}{_SUFFIX}{digest}"
            branch.name = copy.signature.name
        types = node.attr["Tin"].list.type
        for index, chain in chains.items():
            node.input[index] = chain[0].input[0]
            types[index - 1] = _input_type(chain[0])
            moved.update(n.name for n in chain)
    waited_for = {node.name: [name[1:] for name in node.input if name.startswith("^")]
                  for node in rewritten.node if node.name in moved}
    kept = [node for node in rewritten.node if node.name not in moved]
    for node in kept:
        if any(not name.startswith("^") and name.split(":")[0] in moved for name in node.input):
            raise ValueError(f"{node.name} ({node.op}) reads a node restored in a branch: only a conditional "
                             "may read one")
        if any(name[1:] in moved for name in node.input if name.startswith("^")):
            _bypass(node, waited_for)
    del rewritten.node[:]
    rewritten.node.extend(kept)
    return rewritten


def _bypass(node: node_def_pb2.NodeDef, waited_for: dict[str, list[str]]) -> None:
    """Make `node`, which waits for nodes moved into a branch, wait for what those waited for instead (in
    place): a pinned order chains the restores with the nodes around them (`seqmem.rewrite.pin`)."""
    waits, seen = [], set()
    pending = [name[1:] for name in node.input if name.startswith("^")]
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name in waited_for:
            pending += waited_for[name]
        else:
            waits.append(name)
    data = [name for name in node.input if not name.startswith("^")]
    del node.input[:]
    node.input.extend(data + [f"^{name}" for name in waits])


def _marked(node: node_def_pb2.NodeDef) -> bool:
    return RESTORE_IN_BRANCH in node.attr and node.attr[RESTORE_IN_BRANCH].b  # reading a missing key adds it


def _chain(marked: dict[str, node_def_pb2.NodeDef], last: str) -> list[node_def_pb2.NodeDef]:
    """The marked nodes from the one reading the host copy to `last` (a tensor name), in that order."""
    chain = []
    name = last.split(":")[0]
    while name in marked:
        node = marked[name]
        data = [i for i in node.input if not i.startswith("^")]
        if len(data) != 1:
            raise ValueError(f"{name} ({node.op}) restores in a branch but has {len(data)} data inputs, not 1")
        chain.append(node)
        name = data[0].split(":")[0]
    return chain[::-1]


def _restore_in(function: function_pb2.FunctionDef, chains: dict[int, Sequence[node_def_pb2.NodeDef]]) -> None:
    """Give `function` the host copy as argument `index` for each chain, and the chain, copied in, between
    that argument and its readers; each chain waiting for the work of the one before it (in place)."""
    arguments = function.signature.input_arg
    restored = []  # (position of the first reader, the chain's first node)
    for index, chain in chains.items():
        argument = arguments[index].name
        arguments[index].type = _input_type(chain[0])
        function.arg_attr[index].attr.pop("_output_shapes", None)
        readers = [(position, node) for position, node in enumerate(function.node_def)
                   if any(name == argument or name.startswith(argument + ":") for name in node.input)]
        if not readers:
            continue
        copies = []
        for step, original in enumerate(chain):
            copy = function.node_def.add()
            copy.CopyFrom(original)
            del copy.input[:]
            copy.input.append(argument if step == 0 else _output_name(copies[-1]))
            copy.attr.pop(RESTORE_IN_BRANCH)
            copies.append(copy)
        output = _output_name(copies[-1])
        for _, reader in readers:
            for i, name in enumerate(reader.input):
                if name == argument or name.startswith(argument + ":"):
                    reader.input[i] = output
        restored.append((readers[0][0], copies[0]))
    restored.sort(key=lambda item: item[0])
    firsts = [first for _, first in restored]
    work = _own_work(function, [first.name for first in firsts])
    for before, first in zip(work, firsts[1:]):
        first.input.extend(f"^{name}" for name in sorted(before))


def _own_work(function: function_pb2.FunctionDef, starts: Sequence[str]) -> list[set[str]]:
    """For each of the nodes `starts`, the nodes of `function` that depend on it (by data or control edges),
    itself included, and on no other of them: what a restored copy's next restore waits for. (Waiting for
    its readers alone, the next copy could come back before the first one's update ran on, and every
    update's intermediates be held at once.) No node of one set depends on another start, so waiting
    for a set makes no cycle."""
    successors: dict[str, list[str]] = {}
    for node in function.node_def:
        for name in node.input:
            successors.setdefault(name.lstrip("^").split(":")[0], []).append(node.name)
    reached = []
    for start in starts:
        seen, pending = {start}, [start]
        while pending:
            for after in successors.get(pending.pop(), ()):
                if after not in seen:
                    seen.add(after)
                    pending.append(after)
        reached.append(seen)
    reaching = Counter(name for seen in reached for name in seen)  # how many starts reach each node
    return [{name for name in seen if reaching[name] == 1} for seen in reached]


def _input_type(node: node_def_pb2.NodeDef) -> int:
    """The dtype (enum) of `node`'s first input, from its op's definition."""
    argument = op_def_registry.get(node.op).input_arg[0]
    return argument.type or node.attr[argument.type_attr].type


def _output_name(node: node_def_pb2.NodeDef) -> str:
    """How a function body names `node`'s first output."""
    return f"{node.name}:{op_def_registry.get(node.op).output_arg[0].name}:0"
