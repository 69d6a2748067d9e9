"""seqmem.edge.branch_restores: gradients a loss-scale-style `tf.cond` reads, swapped, come back inside its
branch one at a time; the step computes what it did."""

import numpy as np
import pytest
import tensorflow as tf

from seqmem.decisions.plan import Decision, Plan
from seqmem.edge import capture
from seqmem.edge.branch_restores import RESTORE_IN_BRANCH, restore_in_branches
from seqmem.edge.runner import graph_def_runner
from seqmem.edge.swap_nodes import EmulatedDeviceBackend, HostDeviceBackend
from seqmem.ir.op_tables import FUNCTIONAL_COND_OPS
from seqmem.rewrite.conservations import rewrite


def _guarded_step(conditional="cond"):
    """Two dense layers; the gradients applied inside a `tf.cond` over their finite check, as a loss-scale
    optimizer applies them (or a `tf.switch_case` on it: `conditional="case"`). Returns the step, its
    variables and an input."""
    w1 = tf.Variable(tf.random.stateless_normal([16, 32], seed=[0, 1]))
    w2 = tf.Variable(tf.random.stateless_normal([32, 4], seed=[0, 2]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(x @ w1) @ w2)
        gradients = tape.gradient(loss, [w1, w2])
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])

        def apply():
            for variable, gradient in zip((w1, w2), gradients):
                variable.assign_sub(0.01 * gradient)
            return tf.constant(True)

        if conditional == "case":
            tf.switch_case(tf.cast(finite, tf.int32), [lambda: tf.constant(False), apply])
        else:
            tf.cond(finite, apply, lambda: tf.constant(False))
        return loss

    return step, (w1, w2), tf.random.stateless_normal([8, 16], seed=[0, 3])


def _trained_once(step, variables, x):
    """`step`'s concrete function, the losses of 3 calls and the variables after them; the variables are
    then reset to where they started."""
    function = step.get_concrete_function(x)
    starts = [v.numpy() for v in variables]
    losses = [float(step(x)) for _ in range(3)]
    expected = [v.numpy() for v in variables]
    for variable, start in zip(variables, starts):
        variable.assign(start)
    return function, losses, expected


def _assert_trains_the_same(function, graph_def, x, losses, variables, expected):
    runner = graph_def_runner(function, graph_def)
    assert [float(runner(x)[0]) for _ in range(3)] == losses
    for variable, value in zip(variables, expected):
        np.testing.assert_array_equal(variable.numpy(), value)


def _swapped_in_branch(function, backend, count=None):
    """`function`'s graph with every float input of its `If` (the first `count` of them) swapped and
    restored in the branches (`rewrite` with in-branch decisions, then `restore_in_branches`), and the names
    of the inputs."""
    graph = capture.from_tf(function)
    (cond,) = [name for name, node in graph.nodes.items() if node.op in FUNCTIONAL_COND_OPS]
    gradients = [ref for ref in graph.node(cond).inputs[1:] if graph.tensor(ref).dtype == "float32"][:count]
    before = graph.topological_order()
    trigger = before[before.index(cond) - 1]
    decisions = tuple(Decision(ref, graph.tensor(ref).size_bytes, (cond,), trigger, 0.0, in_branch=True)
                      for ref in gradients)
    plan = Plan(1 << 30, 1 << 30, 0, 0, decisions=decisions)
    return restore_in_branches(capture.to_graph_def(rewrite(graph, plan, backend))), cond, gradients


@pytest.mark.parametrize("backend", [EmulatedDeviceBackend(), HostDeviceBackend("/device:CPU:0", "/device:CPU:0")],
                         ids=["emulated", "host-device"])
def test_swapped_gradients_come_back_in_the_branch_one_after_another_and_values_hold(op_determinism, backend):
    step, variables, x = _guarded_step()
    function, losses, expected = _trained_once(step, variables, x)

    graph_def, cond, gradients = _swapped_in_branch(function, backend)
    assert len(gradients) == 2
    assert not any(RESTORE_IN_BRANCH in node.attr for node in graph_def.node)  # all moved
    (node,) = [n for n in graph_def.node if n.name == cond]
    host = {n.name: n for n in graph_def.node}
    copies = [host[name.split(":")[0]].op for name in node.input if "seqmem_swap" in name]
    assert copies == 2 * [{"EmulatedDeviceBackend": "SerializeTensor"}.get(type(backend).__name__, "Identity")]
    library = {f.signature.name: f for f in graph_def.library.function}
    then_branch = library[node.attr["then_branch"].func.name]
    # each chain's first node reads the argument the host copy became
    restores = [n for n in then_branch.node_def
                if "seqmem_swap" in n.name and "seqmem_swap" not in n.input[0]]
    assert len(restores) == 2
    # the second restore waits for every reader of the first
    first, second = sorted(restores, key=lambda n: any(i.startswith("^") for i in n.input))
    assert [i for i in first.input if i.startswith("^")] == []
    assert [i for i in second.input if i.startswith("^")]
    else_branch = library[node.attr["else_branch"].func.name]
    assert not any("seqmem_swap" in n.name for n in else_branch.node_def)  # reads no gradient

    _assert_trains_the_same(function, graph_def, x, losses, variables, expected)


def test_two_plans_branch_copies_take_two_names_and_both_run_in_one_process(op_determinism):
    step, variables, x = _guarded_step()
    starts = [v.numpy() for v in variables]
    function, losses, expected = _trained_once(step, variables, x)
    graph_defs = [_swapped_in_branch(function, EmulatedDeviceBackend(), count)[0] for count in (1, None)]
    names = [{f.signature.name for f in graph_def.library.function} for graph_def in graph_defs]
    assert names[0] != names[1]  # calibration's second plan restores other tensors in the same branch
    for graph_def in graph_defs:  # the first one's functions stay registered in the process
        for variable, start in zip(variables, starts):
            variable.assign(start)
        _assert_trains_the_same(function, graph_def, x, losses, variables, expected)


def test_a_graph_without_marked_restores_is_returned_as_it_is():
    step, _, x = _guarded_step()
    graph_def = step.get_concrete_function(x).graph.as_graph_def()
    assert restore_in_branches(graph_def) is graph_def


def test_a_marked_restore_read_by_anything_but_a_conditional_is_refused():
    step, _, x = _guarded_step()
    graph = capture.from_tf(step.get_concrete_function(x))
    (cond,) = [name for name, node in graph.nodes.items() if node.op in FUNCTIONAL_COND_OPS]
    ref = next(ref for ref in graph.node(cond).inputs[1:] if graph.tensor(ref).dtype == "float32")
    reader = next(name for name in graph.consumers(ref) if name != cond)
    plan = Plan(1 << 30, 1 << 30, 0, 0, decisions=(
        Decision(ref, graph.tensor(ref).size_bytes, (cond, reader), ref.node, 0.0, in_branch=True),))
    graph_def = capture.to_graph_def(rewrite(graph, plan, EmulatedDeviceBackend()))
    with pytest.raises(ValueError, match="only a conditional"):
        restore_in_branches(graph_def)


def test_a_case_restores_in_the_branch_that_reads_and_values_hold(op_determinism):
    step, variables, x = _guarded_step("case")
    function, losses, expected = _trained_once(step, variables, x)

    graph_def, cond, gradients = _swapped_in_branch(function, EmulatedDeviceBackend())
    assert len(gradients) == 2
    (node,) = [n for n in graph_def.node if n.name == cond]
    library = {f.signature.name: f for f in graph_def.library.function}
    parses = [[n for n in library[branch.name].node_def if n.op == "ParseTensor"]
              for branch in node.attr["branches"].list.func]
    assert [len(found) for found in parses] == [0, 2]  # the skipping branch reads no gradient
    _assert_trains_the_same(function, graph_def, x, losses, variables, expected)
