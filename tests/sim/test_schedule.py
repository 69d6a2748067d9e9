from seqmem.sim.schedule import INLINE_BELOW_S, executor_order
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
