from seqmem.sim.reorder import refine_order
from seqmem.sim.schedule import executor_order
from seqmem.sim.simulator import simulate
from tests.builders import graph, node

MB = 1 << 20


def _refine(g, order):
    cost = {name: 1.0 for name in g.nodes}

    def realize(candidate):
        return executor_order(g, cost, chain=candidate)

    def trace_of(candidate):
        return simulate(g, candidate)

    return refine_order(g, realize(order), frozenset(g.nodes), realize, trace_of)


def _two_branches():
    """s -> g0; ra, rb bring back xa, xb (4 MB each); a, b read g0 and xa, xb (4 MB out each); ca, cb
    reduce those (1 MB); out reads ca and cb."""
    return graph(
        node("s", outputs=(1024,)), node("g0", inputs=["s"], outputs=(4 * MB,)),
        node("ra", inputs=["s"], outputs=(4 * MB,)), node("rb", inputs=["s"], outputs=(4 * MB,)),
        node("a", inputs=["g0", "ra"], outputs=(4 * MB,)), node("b", inputs=["g0", "rb"], outputs=(4 * MB,)),
        node("ca", inputs=["a"], outputs=(MB,)), node("cb", inputs=["b"], outputs=(MB,)),
        node("out", inputs=["ca", "cb"], outputs=(4,)), outputs=["out"],
    )


def test_refinement_brings_a_tensor_back_late_and_finishes_a_branch_before_the_next():
    g = _two_branches()
    order = ("s", "g0", "ra", "rb", "a", "b", "ca", "cb", "out")
    before = simulate(g, order).peak_bytes
    refined = _refine(g, order)
    assert sorted(refined) == sorted(order)
    after = simulate(g, refined).peak_bytes
    assert (before, after) == (16 * MB, 13 * MB)
    position = {name: i for i, name in enumerate(refined)}
    assert position["rb"] > position["a"]  # xb comes back once branch a no longer needs g0's company


def test_an_order_no_move_improves_is_returned_as_it_is():
    g = graph(node("x", outputs=(MB,)), node("y", inputs=["x"], outputs=(2 * MB,)),
              node("z", inputs=["y"], outputs=(MB,)), outputs=["z"])
    assert _refine(g, ("x", "y", "z")) == ("x", "y", "z")


def test_at_most_max_trials_candidate_orders_are_simulated():
    g = _two_branches()
    cost = {name: 1.0 for name in g.nodes}
    simulated = []

    def realize(candidate):
        return executor_order(g, cost, chain=candidate)

    def trace_of(candidate):
        simulated.append(candidate)
        return simulate(g, candidate)

    order = realize(("s", "g0", "ra", "rb", "a", "b", "ca", "cb", "out"))
    refined = refine_order(g, order, frozenset(g.nodes), realize, trace_of, max_trials=2)
    assert len(simulated) <= 3  # the order given, then two candidates
    assert simulate(g, refined).peak_bytes <= simulate(g, order).peak_bytes
