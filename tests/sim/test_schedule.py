import pytest

from seqmem.analyze.critical_path import analyze_timing
from seqmem.sim.schedule import INLINE_BELOW_S, executor_order, pinned_nodes, pinned_order, schedule
from tests.builders import graph, node

SLOW = 10 * INLINE_BELOW_S
FAST = INLINE_BELOW_S / 10


def _backward_fork():
    """A gradient `dy` read by two expensive kernels and a cheap update chain, as after a batch-norm gradient."""
    return graph(
        node("dy", "Placeholder"),
        node("filter_grad", "Conv2DBackpropFilter", ["dy"]),
        node("input_grad", "Conv2DBackpropInput", ["dy"]),
        node("next", "ReluGrad", ["input_grad"]),
        node("neg", "Neg", ["dy"]),
        node("apply", "AssignSub", ["neg"]),
    )


def test_cheap_readers_run_inline_first_and_expensive_ones_wait_last_in_first_out():
    g = _backward_fork()
    cost = {"dy": 0.0, "filter_grad": SLOW, "input_grad": SLOW, "next": SLOW, "neg": FAST, "apply": FAST}
    # readers are met in reverse graph order: neg, input_grad, filter_grad; the cheap chain runs inline,
    # both expensive kernels go to the pool, and the one handed over last (filter_grad) runs first
    assert executor_order(g, cost) == ("dy", "neg", "apply", "filter_grad", "input_grad", "next")


def test_the_last_expensive_reader_runs_inline_when_nothing_cheap_is_queued():
    g = graph(node("x", "Placeholder"), node("a", "MatMul", ["x"]), node("b", "MatMul", ["x"]),
              node("c", "Relu", ["b"]))
    cost = {"x": 0.0, "a": SLOW, "b": SLOW, "c": SLOW}
    # met as b, a: b goes to the pool, a runs inline; then b and its reader c
    assert executor_order(g, cost) == ("x", "a", "b", "c")


def test_view_and_variable_reads_are_inline_whatever_they_cost():
    g = graph(node("v", "VarHandleOp", outputs=(0,)), node("read", "ReadVariableOp", ["v"]),
              node("x", "Placeholder"), node("m", "MatMul", ["x", "read"]))
    order = executor_order(g, {"v": SLOW, "read": SLOW, "x": SLOW, "m": SLOW})
    assert order == ("v", "read", "x", "m")
    assert sorted(order) == sorted(g.nodes)


def test_a_chain_makes_the_executor_run_its_nodes_in_chain_order():
    g = _backward_fork()
    cost = {"dy": 0.0, "filter_grad": SLOW, "input_grad": SLOW, "next": SLOW, "neg": FAST, "apply": FAST}
    # pinned: the input gradient and its reader first, the filter gradient after them
    order = executor_order(g, cost, chain=("input_grad", "next", "filter_grad"))
    assert order == ("dy", "neg", "apply", "input_grad", "next", "filter_grad")


def test_a_chain_against_the_graph_is_refused():
    g = _backward_fork()
    cost = dict.fromkeys(g.nodes, SLOW)
    with pytest.raises(ValueError, match="topological"):
        executor_order(g, cost, chain=("next", "input_grad"))


def test_pinned_order_chains_the_schedule_and_leaves_inline_ops_free():
    g = graph(node("x", "Placeholder"), node("a", "MatMul", ["x"]), node("b", "MatMul", ["x"]),
              node("view", "Reshape", ["b"]), node("c", "MatMul", ["a"]), node("d", "AddV2", ["c", "view"]))
    cost = {"x": 0.0, "a": 1.0, "b": 3.0, "view": 0.0, "c": 1.0, "d": 1.0}
    timing = analyze_timing(g, cost)
    # ASAP: a and b at 0 s, c at 1 s; the view runs as soon as b is done
    assert pinned_nodes(g, schedule(g, timing)) == ("a", "b", "c", "d")
    assert pinned_order(g, timing) == ("x", "a", "b", "view", "c", "d")


def test_graphs_with_tf1_control_flow_are_not_pinned():
    g = graph(node("x", "Placeholder"), node("p", "Placeholder"), node("s", "Switch", ["x", "p"], outputs=(4, 4)),
              node("a", "MatMul", ["s:1"]))
    assert pinned_order(g, analyze_timing(g, dict.fromkeys(g.nodes, 1.0))) == ()


def _momentum_update():
    """x -> f -> grad; an optimizer's `slot * momentum` reads only a variable and a constant."""
    from seqmem.ir.graph import TensorInfo

    return graph(
        node("x", "Placeholder", outputs=(400,)),
        node("slot", "Placeholder", outputs=(TensorInfo("resource", (), 0),)),
        node("momentum", "Const"),
        node("read", "ReadVariableOp", ["slot"], outputs=(4000,)),
        node("scaled", "Mul", ["read", "momentum"], outputs=(4000,)),
        node("f", "Conv2D", ["x"], outputs=(400,)),
        node("g", "Conv2DBackpropInput", ["f"], outputs=(400,)),
        node("new_slot", "AddV2", ["g", "scaled"], outputs=(4000,)),
        node("assign", "AssignVariableOp", ["slot", "new_slot"], outputs=(), control=["read"]),
    )


def test_deferred_schedule_moves_what_reads_no_step_input_to_just_before_its_reader_after_the_loss():
    from seqmem.sim.schedule import deferred_schedule

    g = _momentum_update()
    cost = {name: FAST for name in g.nodes}
    cost.update(f=SLOW, g=SLOW)
    timing = analyze_timing(g, cost, ["g"])
    assert schedule(g, timing).index("scaled") < schedule(g, timing).index("g")  # ASAP: before the backward op
    assert deferred_schedule(g, timing) == schedule(g, timing)  # no loss named: nothing is deferred
    order = deferred_schedule(g, timing, ["f"])
    assert order.index("g") < order.index("scaled") == order.index("new_slot") - 1
    assert sorted(order) == sorted(g.nodes)
    assert pinned_nodes(g, order).index("scaled") > pinned_nodes(g, order).index("g")


def test_measured_order_follows_the_trace_and_puts_what_it_lacks_before_its_first_listed_reader():
    from seqmem.sim.schedule import measured_order

    g = _momentum_update()
    # as TensorFlow ran it: the slot's `momentum * slot` first (it reads no step input), then the pass;
    # the placeholders and the constant have no event, nor does `read`, which Grappler fused into `scaled`
    started = ("scaled", "f", "g", "new_slot", "assign", "not_in_the_graph")
    order = measured_order(g, started)
    assert [name for name in order if name in started] == list(started[:-1])
    assert order.index("read") == order.index("scaled") - 1
    assert order.index("x") < order.index("f") and order.index("momentum") < order.index("scaled")
    assert sorted(order) == sorted(g.nodes)


def test_measured_order_keeps_the_graphs_edges_where_the_trace_contradicts_them():
    from seqmem.sim.schedule import measured_order

    g = _backward_fork()
    order = measured_order(g, ("next", "input_grad", "filter_grad", "dy"))
    position = {name: i for i, name in enumerate(order)}
    for name in g.nodes:
        assert all(position[pred] < position[name] for pred in g.ordering_predecessors(name))
    assert order.index("input_grad") < order.index("filter_grad")  # the trace's order where the edges allow
