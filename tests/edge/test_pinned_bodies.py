"""seqmem.edge.pinned_bodies: every loop body and condition chained in the order the simulator charges an
iteration for; results unchanged."""

import tensorflow as tf

from seqmem.edge import capture
from seqmem.edge.bodies import branch_order, iteration_order, sized_bodies
from seqmem.edge.library import FunctionBodies, branches
from seqmem.edge.loops import bound_loops
from seqmem.edge.pinned_bodies import left_to_grappler, pin_branches, pin_loop_bodies
from seqmem.edge.variable_shapes import variable_shapes
from tests.edge.rnn_step import assert_trains_the_same, rnn_step
from tests.keras_steps import conditional_update_step


def _loop_functions(graph_def):
    """The bodies and conditions of the graph's while loops."""
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return {n.attr[key].func.name for n in nodes if n.op in ("While", "StatelessWhile") for key in ("body", "cond")}


def test_each_loop_body_and_condition_runs_one_chain_and_the_step_trains_the_same(op_determinism):
    function, variables, inputs, _owners = rnn_step()
    graph_def = bound_loops(function.graph.as_graph_def(), 1)
    pinned = pin_loop_bodies(graph_def)
    bodies = _loop_functions(pinned)
    assert len(bodies) >= 8  # a condition ordered by its data edges alone keeps its name
    assert sum(name.endswith("_seqmem_pinned") for name in bodies) >= 4
    functions = {f.signature.name: f for f in pinned.library.function}
    graphs = FunctionBodies(pinned.library)
    for name in bodies:
        order = iteration_order(capture.from_tf(graphs.get(name)))
        nodes = {n.name: n for n in functions[name].node_def}
        left_out = left_to_grappler(functions[name])
        chain = [node for node in order if node in nodes and node not in left_out]
        assert len(chain) + len(left_out) == len(nodes)
        for before, after in zip(chain, chain[1:]):  # each waits for the one before it, by some direct edge
            assert before in {i.lstrip("^").split(":")[0] for i in nodes[after].input}
    assert not any(name.endswith("_seqmem_pinned") for name in _loop_functions(graph_def))  # input as it was
    assert_trains_the_same(function, variables, inputs, pinned)


def test_identities_and_sums_grappler_collapses_are_left_out_of_the_chain():
    @tf.function(autograph=False)
    def f(a, b, c):
        total = tf.add(tf.add(a, b, name="inner"), c, name="outer")  # one sum to grappler: AddN(a, b, c)
        shared = tf.add(a, c, name="shared")  # read twice: stays a node of its own
        return tf.identity(total, name="same"), tf.add(shared, b, name="after") * tf.exp(shared, name="exp")

    function = f.get_concrete_function(*[tf.TensorSpec([4])] * 3).function_def
    assert {"inner", "outer", "same"} <= left_to_grappler(function)
    assert not {"shared", "after", "exp"} & left_to_grappler(function)


def test_a_graph_without_loops_is_returned_as_it_was():
    graph_def = tf.function(lambda x: tf.nn.relu(x)).get_concrete_function(tf.TensorSpec([3])).graph.as_graph_def()
    assert pin_loop_bodies(graph_def) is graph_def


def test_a_conditionals_branches_run_in_their_branch_order_and_the_step_trains_the_same(op_determinism):
    function, variables, _optimizer = conditional_update_step(4)  # four 1 MiB variables, updated in a conditional's branch
    graph_def = function.graph.as_graph_def()
    shapes = variable_shapes(capture.from_tf(function))
    pinned = pin_branches(graph_def, shapes)
    (cond,) = [node for node in pinned.node if node.op in ("If", "StatelessIf")]
    update = branches(cond)[0].name
    assert update.endswith("_seqmem_pinned")  # the other branch, one constant, needs no chain
    # the update branch's own order, one variable's update after another, holds 2 MiB, the executor's 5
    # (`test_bodies`)
    body = capture.from_tf(sized_bodies(graph_def, shapes).get(update.removesuffix("_seqmem_pinned")))
    order = branch_order(body)
    assert order == body.topological_order()
    function_def = {f.signature.name: f for f in pinned.library.function}[update]
    nodes = {n.name: n for n in function_def.node_def}
    chain = [name for name in order if name in nodes and name not in left_to_grappler(function_def)]
    for before, after in zip(chain, chain[1:]):
        assert before in {i.lstrip("^").split(":")[0] for i in nodes[after].input}
    assert_trains_the_same(function, variables, tf.constant(True), pinned)
