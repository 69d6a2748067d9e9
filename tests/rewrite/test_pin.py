import pytest

from seqmem.ir.graph import TensorRef
from seqmem.rewrite.pin import pin
from seqmem.decisions.plan import Decision, Plan
from seqmem.rewrite.conservations import rewrite
from tests.builders import IdentityBackend, graph, node, training_graph


def test_pinned_nodes_wait_for_the_one_before_and_inline_ops_stay_free():
    g = graph(node("x", "Placeholder"), node("a", "MatMul", ["x"]), node("b", "MatMul", ["x"]),
              node("view", "Reshape", ["a"]), node("c", "MatMul", ["view", "b"]))
    pinned = pin(g, ["x", "b", "a", "view", "c"])
    assert pinned.node("a").control_inputs == ("b",)
    assert pinned.node("b").control_inputs == ()
    # c already reads a (through the view, which is free) and b: it waits for a by a control edge
    assert pinned.node("c").control_inputs == ("a",)
    assert pinned.node("view").control_inputs == ()


def test_a_variable_read_that_copies_is_pinned_and_one_that_shares_stays_free():
    from seqmem.ir.graph import TensorInfo

    copy = TensorInfo("float32", (4, 4), 64, copies_input=True)
    g = graph(node("v", "VarHandleOp", outputs=(0,)), node("x", "Placeholder"), node("a", "MatMul", ["x"]),
              node("read", "ReadVariableOp", ["v"]), node("copy", "ReadVariableOp", ["v"], outputs=(copy,)),
              node("b", "MatMul", ["a", "read", "copy"]))
    pinned = pin(g, ["v", "x", "a", "read", "copy", "b"])
    # left free, the copying read would run at the start and hold its copy through a
    assert pinned.node("copy").control_inputs == ("a",) and pinned.node("read").control_inputs == ()


def test_a_pair_ordered_by_a_data_edge_gets_no_control_edge():
    g = graph(node("x", "Placeholder"), node("a", "MatMul", ["x"]), node("b", "MatMul", ["a"]))
    assert pin(g, ["x", "a", "b"]).node("b").control_inputs == ()


def test_a_function_call_waits_by_a_control_edge_even_for_a_node_it_reads():
    # inlined, the call's body would wait for `a` only in the nodes that read that input
    g = graph(node("x", "Placeholder"), node("a", "MatMul", ["x"]), node("call", "PartitionedCall", ["a", "x"]),
              node("b", "MatMul", ["call"]))
    pinned = pin(g, ["x", "a", "call", "b"])
    assert pinned.node("call").control_inputs == ("a",) and pinned.node("b").control_inputs == ()


@pytest.mark.parametrize("op", ["While", "StatelessIf"])
def test_a_reader_of_a_loop_or_a_conditional_waits_for_it_by_a_control_edge(op):
    # lowered, a loop hands out a resource its body passes through before its first iteration
    g = graph(node("x", "Placeholder"), node("loop", op, ["x"]), node("b", "MatMul", ["loop"]))
    assert pin(g, ["x", "loop", "b"]).node("b").control_inputs == ("loop",)


def test_an_order_that_misses_nodes_is_refused():
    g = graph(node("x", "Placeholder"), node("a", "MatMul", ["x"]))
    with pytest.raises(ValueError, match="every node"):
        pin(g, ["a"])


_ORDER = ("x", "w", "f1", "f2", "loss", "ones", "gradient_tape/g2", "gradient_tape/g1", "update")


def test_a_pinned_plan_runs_each_swap_out_after_its_producer_and_each_swap_in_after_its_trigger():
    decision = Decision(TensorRef("f1", 0), 1000, ("gradient_tape/g1",), "gradient_tape/g2", 0.0)
    plan = Plan(10_000, 10_000, 5000, 4000, decisions=(decision,), pinned_order=_ORDER)
    rewritten = rewrite(training_graph(), plan, IdentityBackend())
    # chain: f1, out, f2, loss, g2, in, g1, update (x, w and ones are free)
    control = {name: node.control_inputs for name, node in rewritten.nodes.items() if node.control_inputs}
    assert control == {
        "f2": ("f1-seqmem_swap0_0/out",),
        "gradient_tape/g2": ("loss",),
        "f1-seqmem_swap0_0/in": ("gradient_tape/g2",),  # its trigger, which is also the one before it
    }


def test_a_plan_without_swaps_is_still_pinned():
    plan = Plan(10_000, 10_000, 5000, 5000, pinned_order=_ORDER)
    rewritten = rewrite(training_graph(), plan, IdentityBackend())
    assert rewritten.node("gradient_tape/g2").control_inputs == ("loss",)


def test_products_grappler_regroups_stay_free():
    # (g * x) * c: a control edge on either product keeps Grappler from regrouping them as in the original
    g = graph(node("x", "Placeholder"), node("g", "MatMul", ["x"]), node("c", "Const"), node("h", "MatMul", ["x"]),
              node("inner", "Mul", ["g", "x"]), node("outer", "Mul", ["inner", "c"]))
    pinned = pin(g, ["x", "c", "g", "h", "inner", "outer"])
    assert pinned.node("h").control_inputs == ("g",)
    assert pinned.node("inner").control_inputs == () and pinned.node("outer").control_inputs == ()

