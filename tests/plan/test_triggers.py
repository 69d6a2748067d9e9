from seqmem.analyze.critical_path import analyze_timing
from seqmem.plan.triggers import TriggerIndex
from tests.builders import graph, node


def _backward_chain():
    """f (forward) -> b1 -> b2 -> b3 -> b4 (backward), each backward node 1 s; b4 reads f's swapped tensor."""
    g = graph(node("f"), node("b1", inputs=["f"]), node("b2", inputs=["b1"]), node("b3", inputs=["b2"]),
              node("b4", inputs=["b3", "f"]))
    cost = {"f": 1.0, "b1": 1.0, "b2": 1.0, "b3": 1.0, "b4": 1.0}
    return g, analyze_timing(g, cost), ["b1", "b2", "b3", "b4"]


def test_trigger_is_the_latest_node_that_still_hides_the_transfer():
    g, timing, backward = _backward_chain()
    index = TriggerIndex(g, timing, backward)
    # b4 starts at 4 s: a 0.5 s copy must start by 3.5 s, so after b2 (done at 3 s), not b3 (4 s)
    assert index.choose(["b4"], 0.5) == ("b2", True)
    assert index.choose(["b4"], 1.5) == ("b1", True)


def test_transfer_too_long_to_hide_takes_the_latest_predecessor_unhidden():
    g, timing, backward = _backward_chain()
    assert TriggerIndex(g, timing, backward).choose(["b4"], 10.0) == ("b3", False)


def test_no_backward_node_before_the_consumer_means_no_trigger():
    g, timing, backward = _backward_chain()
    assert TriggerIndex(g, timing, backward).choose(["b1"], 0.1) == (None, False)


def test_trigger_never_depends_on_a_consumer():
    g, timing, backward = _backward_chain()
    trigger, _ = TriggerIndex(g, timing, backward).choose(["b3", "b4"], 0.0)
    assert trigger not in g.descendants(["b3"]) and trigger != "b3"


def test_a_pinned_step_takes_its_trigger_from_before_the_consumer_in_the_pinned_order():
    """x finishes (3 s) long before c starts (7 s) and precedes c in the graph's topological order, but the
    step is pinned to run c first: x as c's trigger would make c wait for x and the pinned chain x for c."""
    g = graph(node("f"), node("b1", inputs=["f"]), node("x", inputs=["b1"]), node("slow", inputs=["b1"]),
              node("c", inputs=["b1", "f", "slow"]))
    timing = analyze_timing(g, {"f": 1.0, "b1": 1.0, "x": 1.0, "slow": 5.0, "c": 1.0})
    backward = ["b1", "x", "slow", "c"]
    assert TriggerIndex(g, timing, backward).choose(["c"], 0.5) == ("x", True)
    pinned = {name: i for i, name in enumerate(["f", "b1", "slow", "c", "x"])}
    assert TriggerIndex(g, timing, backward, pinned).choose(["c"], 0.5) == ("b1", True)


def test_the_last_node_before_the_consumer_in_the_order_the_step_runs_in():
    """a and c both start at 2 s by the ASAP estimate: `choose` with no lead time must take b1 (a completes
    after c starts), but a step pinned to run a, then c can restore c's tensor after a."""
    g = graph(node("f"), node("b1", inputs=["f"]), node("a", inputs=["b1"]), node("c", inputs=["b1", "f"]))
    timing = analyze_timing(g, {"f": 1.0, "b1": 1.0, "a": 1.0, "c": 1.0})
    backward = ["b1", "a", "c"]
    pinned = {name: i for i, name in enumerate(["f", "b1", "a", "c"])}
    index = TriggerIndex(g, timing, backward, pinned)
    assert index.choose(["c"], 0.0) == ("b1", True)
    assert index.last_before(["c"]) == "a"
    assert index.last_before(["a", "c"]) == "b1"
    assert index.last_before(["b1"]) is None
