import pytest

from seqmem.errors import GraphError
from seqmem.ir.graph import TensorRef, loop_value_buffer
from tests.builders import graph, node, training_graph


def test_tensor_ref_parse_and_str():
    assert TensorRef.parse("a/b:3") == TensorRef("a/b", 3)
    assert TensorRef.parse("a/b") == TensorRef("a/b", 0)
    assert str(TensorRef("x", 1)) == "x:1"


def test_consumers_order_and_reachability():
    g = training_graph()
    assert g.consumers(TensorRef("f1")) == ("f2", "gradient_tape/g1")
    assert g.topological_order().index("f1") < g.topological_order().index("f2")
    assert g.ancestors(["loss"]) == {"x", "w", "f1", "f2"}
    assert g.descendants(["gradient_tape/g2"]) == {"gradient_tape/g1", "update"}
    g.validate()


def test_topological_order_is_deterministic_and_respects_control_edges():
    g = graph(node("b", control=["a"]), node("a"), node("c", inputs=["b"]))
    assert g.topological_order() == ("a", "b", "c")


def test_tf1_loop_back_edge_is_not_a_cycle():
    g = graph(
        node("enter", "Enter"),
        node("merge", "Merge", ["enter", "next"]),
        node("body", "Op", ["merge"]),
        node("next", "NextIteration", ["body"]),
    )
    assert g.topological_order() == ("enter", "merge", "body", "next")


def test_cycle_is_reported():
    g = graph(node("a", inputs=["b"]), node("b", inputs=["a"]))
    with pytest.raises(GraphError, match="cycle"):
        g.validate()


@pytest.mark.parametrize(
    "nodes, message",
    [
        ((node("a"), node("a")), "two nodes are named 'a'"),
        ((node("a", inputs=["missing"]),), "'missing', which is not in the graph"),
        ((node("a"), node("b", inputs=["a:3"])), "has only 1 outputs"),
        ((node("a", control=["ghost"]),), "control input 'ghost'"),
    ],
)
def test_malformed_graphs_raise_graph_error(nodes, message):
    with pytest.raises(GraphError, match=message):
        graph(*nodes)


def test_lookups_of_missing_things_raise_graph_error_not_key_error():
    g = training_graph()
    with pytest.raises(GraphError, match="no node named 'nope'"):
        g.node("nope")
    with pytest.raises(GraphError, match="no output 5"):
        g.tensor(TensorRef("f1", 5))


def test_replace_builds_a_new_graph_and_keeps_the_old():
    g = training_graph()
    smaller = g.replace(nodes=[n for n in g.nodes.values() if n.name != "update"])
    assert "update" in g and "update" not in smaller
    assert len(smaller) == len(g) - 1


def test_a_loop_value_is_followed_through_views_and_loop_variables_to_its_buffer():
    # x = Identity(h); h is a loop variable whose next value the body returns as y = Reshape(z)
    views = {"x": "h", "y": "z"}
    assert loop_value_buffer("x", {"h": "y"}, views.get) == "z"
    assert loop_value_buffer("x", {}, views.get) == "h"  # h is an argument nothing returns for
    # a variable returned unchanged (h -> Identity(h)) ends at itself instead of cycling
    assert loop_value_buffer("h", {"h": "i"}, {"i": "h"}.get) == "h"
