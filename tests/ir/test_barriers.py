import pytest

from seqmem.ir.graph import TensorRef
from seqmem.ir.barriers import barrier_source, gradient_barriers, split_barriers
from tests.builders import graph, node


def _optimizer_step():
    """Two gradients joined by an IdentityN (as Keras' optimizers do) before their updates."""
    return graph(
        node("x", "Placeholder"),
        node("g1", "Op", ["x"]),
        node("g2", "Op", ["g1"]),
        node("ready", "NoOp", outputs=()),
        node("join", "IdentityN", ["g1", "g2"], outputs=(4, 4), control=["ready"]),
        node("update1", "AssignSub", ["join:0"], outputs=()),
        node("update2", "AssignSub", ["join:1"], outputs=()),
        node("after_all", "NoOp", control=["join"], outputs=()),
        node("single", "IdentityN", ["x"]),
        outputs=["join:1", "single"],
    )


def test_only_joins_of_two_or_more_tensors_are_barriers():
    assert gradient_barriers(_optimizer_step()) == ("join",)


def test_each_reader_reads_the_barriers_input_and_waits_for_what_the_barrier_waited_for():
    split = split_barriers(_optimizer_step(), ("join",))
    split.validate()
    assert "join" not in split
    assert split.node("update1").inputs == (TensorRef("g1"),)
    assert split.node("update2").inputs == (TensorRef("g2"),)
    assert split.node("update1").control_inputs == ("ready",)  # the barrier's own control input
    assert split.node("after_all").control_inputs == ("g1", "g2", "ready")  # waits for everything it joined
    assert split.outputs == (TensorRef("g2"), TensorRef("single"))
    assert split.node("single").inputs == (TensorRef("x"),)  # not split


def test_update1_no_longer_waits_for_g2():
    g = _optimizer_step()
    assert "g2" in g.ancestors(["update1"])
    assert "g2" not in split_barriers(g, gradient_barriers(g)).ancestors(["update1"])


def test_nothing_to_split_returns_the_graph_and_a_wrong_name_is_a_value_error():
    g = _optimizer_step()
    assert split_barriers(g, ()) is g
    with pytest.raises(ValueError, match="single"):
        split_barriers(g, ("single",))


def test_a_plan_records_its_split_barriers_in_the_summary_and_the_json():
    from seqmem.decisions.plan import Plan

    plan = Plan(budget_bytes=100, target_bytes=90, predicted_peak_before_bytes=120, predicted_peak_after_bytes=80,
                split_barriers=("IdentityN",))
    assert "1 gradient barrier(s) split" in plan.summary()
    assert Plan.from_json(plan.to_json()) == plan


def test_an_update_waits_for_the_backward_ops_that_still_read_its_weight():
    from seqmem.ir.graph import TensorInfo

    g = graph(
        node("x", "Placeholder"),
        node("w", "Placeholder", outputs=(TensorInfo("resource", (), 0),)),
        node("read", "ReadVariableOp", ["w"]),
        node("view", "Identity", ["read"]),
        node("y", "MatMul", ["x", "view"]),
        node("dw", "Op", ["y", "x"]),
        node("g2", "Op", ["dw"]),
        node("join", "IdentityN", ["dw", "g2"], outputs=(4, 4)),
        node("update", "AssignSubVariableOp", ["w", "join:0"], outputs=(), control=["read"]),
        node("dx", "MatMul", ["y", "view"]),  # the backward op reading the weight, not before the update otherwise
    )
    split = split_barriers(g, ("join",))
    assert split.node("update").control_inputs == ("read", "view", "y", "dx")
    assert "dx" in split.ancestors(["update"])
    split.validate()


def test_barrier_source_follows_barriers_to_the_tensor_they_pass_on():
    g = _optimizer_step()
    assert barrier_source(g, TensorRef("join", 1), ("join",)) == TensorRef("g2")
    assert barrier_source(g, TensorRef("join", 1), ()) == TensorRef("join", 1)  # not split
    assert barrier_source(g, TensorRef("g1"), ("join",)) == TensorRef("g1")


def test_a_loss_that_a_custom_gradient_returns_survives_the_split():
    """tf.custom_gradient returns its outputs through an IdentityN of all its inputs: a barrier whose
    output 0 is the loss (seqmem.projected_mean_cross_entropy's mean)."""
    import tensorflow as tf

    from seqmem.analyze.analysis import analyze_graph, without_barriers
    from seqmem.edge import capture
    from seqmem.layers.softmax_loss import projected_mean_cross_entropy

    kernel = tf.Variable(tf.ones([4, 7]))
    dense = tf.Variable(tf.ones([4, 4]))
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build([dense, kernel])

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = projected_mean_cross_entropy(tf.matmul(features, dense), labels, kernel, blocks=2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [dense, kernel]), [dense, kernel]))
        return loss

    function = step.get_concrete_function(tf.TensorSpec([6, 4]), tf.TensorSpec([6], tf.int32))
    analysis = analyze_graph(capture.from_tf(function), inter_op_threads=1)
    (loss,) = analysis.anatomy.losses
    assert analysis.graph.node(loss.node).op == "IdentityN" and loss.node in gradient_barriers(analysis.graph)
    split = without_barriers(analysis)
    assert split is not None and split.anatomy.losses == (barrier_source(analysis.graph, loss, (loss.node,)),)
    assert split.graph.node(split.anatomy.losses[0].node).op != "IdentityN"


def test_a_plan_is_simulated_on_the_graph_it_rewrites_in_the_order_it_pins():
    import dataclasses

    from seqmem.analyze.analysis import analyze_graph, as_planned
    from seqmem.plan import choose_conservations
    from seqmem.ir.graph import TensorInfo

    g = graph(
        node("x", "Placeholder", outputs=(1024,)),
        node("f", "Op", ["x"], outputs=(1024,)),
        node("loss", "Sum", ["f"], outputs=(TensorInfo("float32", (), 4),)),
        node("gradient_tape/g1", "Op", ["loss", "f"], outputs=(1024,)),
        node("gradient_tape/g2", "Op", ["gradient_tape/g1"], outputs=(1024,)),
        node("join", "IdentityN", ["gradient_tape/g1", "gradient_tape/g2"], outputs=(1024, 1024)),
        node("update1", "AssignSub", ["join:0"], outputs=()),
        node("update2", "AssignSub", ["join:1"], outputs=()),
    )
    analysis = analyze_graph(g, inter_op_threads=1)
    plan = choose_conservations(analysis, 1 << 40, pinned=True).fitting_plan()
    assert as_planned(analysis, plan).order == plan.pinned_order
    split = as_planned(analysis, dataclasses.replace(plan, split_barriers=("join",), pinned_order=()))
    assert "join" not in split.graph  # each update runs once its own gradient exists
    assert split.order.index("update1") < split.order.index("gradient_tape/g2")
    assert as_planned(analysis, dataclasses.replace(plan, pinned_order=())) is analysis
