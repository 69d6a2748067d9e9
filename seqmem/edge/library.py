"""Functions of a GraphDef's library: which ones a node calls, which change variables, and editing them
under new names.

A function already registered in TensorFlow's runtime cannot be redefined
under its own name, so an edited function gets a copy `<name><suffix>`, and so
does every function that calls one (directly, as a loop body or branch, or
through a call op), up to the graph; each reference then follows the copy.

A copy no longer stands for an API: Keras marks its LSTM and GRU functions
with `api_implements`, and Grappler's implementation selector replaces a call
of such a function with an equivalent registered one for the device (on CPU,
the unedited original still in the runtime's library). Copies drop those
attributes, so the edited function is the one that runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from seqmem.ir.op_tables import writes_variable

__all__ = ["FunctionBodies", "branches", "called_functions", "nodes_running", "use_copies", "variable_writers"]


class FunctionBodies:
    """The graphs of a library's functions, each built once, on first use, inside a graph that holds the
    whole library: a function may run another (a loop body, a branch) that only this library defines, such
    as an edited copy (`use_copies`), which TensorFlow's runtime has not seen."""

    def __init__(self, library: function_pb2.FunctionDefLibrary) -> None:
        self._library = library
        self._function_defs = {f.signature.name: f for f in library.function}
        self._graphs: dict[str, tf.Graph] = {}
        self._holder: Optional[tf.Graph] = None

    def __contains__(self, name: str) -> bool:
        return name in self._function_defs

    def get(self, name: str) -> Optional[tf.Graph]:
        """The graph of function `name` (its arguments are its `inputs`), or None when the library has none."""
        if name not in self._function_defs:
            return None
        if name not in self._graphs:
            if self._holder is None:
                self._holder = tf.Graph()
                with self._holder.as_default():
                    tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=self._library), name="")
            with self._holder.as_default():
                self._graphs[name] = function_def_to_graph(self._function_defs[name])
        return self._graphs[name]

# FunctionDef attributes by which Grappler's implementation selector swaps a function for an equivalent one
_API_ATTRIBUTES = ("api_implements", "api_preferred_device", "backward_function_name", "forward_function_name")


def called_functions(node: node_def_pb2.NodeDef) -> set[str]:
    """Names `node` may call: its op, and every function-valued attribute (a call's `f`, a loop's `body`
    and `cond`, a conditional's branches)."""
    names = {node.op}
    for value in node.attr.values():
        if value.HasField("func"):
            names.add(value.func.name)
        names.update(f.name for f in value.list.func)
    return names


def branches(node: node_def_pb2.NodeDef) -> list[attr_value_pb2.NameAttrList]:
    """The references to the branch functions of a conditional node (`If`, `Case` and their stateless
    forms), in order; editing one edits the node."""
    if "branches" in node.attr:
        return list(node.attr["branches"].list.func)
    return [node.attr[key].func for key in ("then_branch", "else_branch")]


def _with_callers(library: function_pb2.FunctionDefLibrary, names: Iterable[str]) -> set[str]:
    """`names` and every library function that calls one of them, transitively."""
    calls = {f.signature.name: {name for n in f.node_def for name in called_functions(n)} for f in library.function}
    found = set(names)
    grew = True
    while grew:
        callers = {name for name, called in calls.items() if called & found} - found
        found |= callers
        grew = bool(callers)
    return found


def nodes_running(graph_def: graph_pb2.GraphDef, node_name: str) -> frozenset[str]:
    """Names of the graph's nodes that run a library function holding a node named `node_name` (as a call,
    a loop's body or condition, a branch), at any depth."""
    holding = [f.signature.name for f in graph_def.library.function if any(n.name == node_name for n in f.node_def)]
    if not holding:
        return frozenset()
    running = _with_callers(graph_def.library, holding)
    return frozenset(node.name for node in graph_def.node if called_functions(node) & running)


def use_copies(graph_def: graph_pb2.GraphDef, edited: Iterable[str], suffix: str) -> None:
    """Rename the `edited` functions of `graph_def`'s library, and every function that calls one,
    transitively, to `<name><suffix>`, and point every reference in the graph and its library at the copies
    (in place; module docstring)."""
    renamed = {name: f"{name}{suffix}" for name in sorted(_with_callers(graph_def.library, edited))}
    _rename_functions(graph_def.library, renamed)
    _follow_copies(graph_def.node, renamed)


def variable_writers(graph_def: graph_pb2.GraphDef) -> frozenset[str]:
    """Names of the graph's nodes that change a variable: by their op, or in a function they call (as a
    call, a loop's body, a branch), at any depth."""
    writing = _with_callers(graph_def.library, (f.signature.name for f in graph_def.library.function
                                                if any(writes_variable(n.op) for n in f.node_def)))
    return frozenset(node.name for node in graph_def.node
                     if writes_variable(node.op) or called_functions(node) & writing)


def _follow_copies(nodes: Iterable[node_def_pb2.NodeDef], renamed: dict[str, str]) -> None:
    """Point every reference in `nodes` to a renamed function at its copy (in place)."""
    for node in nodes:
        if node.op in renamed:
            node.op = renamed[node.op]
        for value in node.attr.values():
            if value.HasField("func") and value.func.name in renamed:
                value.func.name = renamed[value.func.name]
            for function in value.list.func:
                if function.name in renamed:
                    function.name = renamed[function.name]


def _rename_functions(library: function_pb2.FunctionDefLibrary, renamed: dict[str, str]) -> None:
    """Rename the library's functions and gradient entries by `renamed`, drop the renamed ones' API
    attributes (module docstring), and follow the copies inside (in place)."""
    for function in library.function:
        if function.signature.name in renamed:
            function.signature.name = renamed[function.signature.name]
            for name in _API_ATTRIBUTES:
                function.attr.pop(name, None)
        _follow_copies(function.node_def, renamed)
    for gradient in library.gradient:
        gradient.function_name = renamed.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = renamed.get(gradient.gradient_func, gradient.gradient_func)
