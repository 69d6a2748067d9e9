import pytest

from seqmem.analyze.critical_path import MachineModel, analyze_timing, contraction_flops, measured_costs, static_costs
from seqmem.ir.graph import TensorInfo
from tests.builders import graph, node, training_graph

UNIT_COSTS = {"x": 0.0, "w": 0.0, "ones": 0.0, "f1": 1.0, "f2": 1.0, "loss": 1.0,
              "gradient_tape/g2": 1.0, "gradient_tape/g1": 1.0, "update": 1.0}


def test_asap_times_slack_distance_and_critical_path_by_hand():
    timing = analyze_timing(training_graph(), UNIT_COSTS, loss_nodes=["loss"])
    assert timing.start_s["gradient_tape/g2"] == 2.0
    assert timing.completion_s["gradient_tape/g1"] == 4.0
    assert timing.makespan_s == 5.0
    assert timing.slack_s["loss"] == 2.0          # nothing waits on the loss
    assert timing.slack_s["f2"] == 0.0            # on the critical path
    assert timing.distance_to_loss_s == {"loss": 0.0, "f2": 1.0, "f1": 2.0, "x": 3.0, "w": 3.0}
    assert timing.critical_path[-4:] == ("f2", "gradient_tape/g2", "gradient_tape/g1", "update")


def test_missing_cost_is_a_clear_error():
    with pytest.raises(ValueError, match="no cost for 1 nodes"):
        analyze_timing(training_graph(), {k: v for k, v in UNIT_COSTS.items() if k != "f1"})


def _info(shape):
    size = 4
    for d in shape:
        size *= d
    return TensorInfo("float32", tuple(shape), size)


def test_contraction_flops():
    g = graph(
        node("a", "Placeholder", outputs=(_info([8, 16]),)),
        node("b", "Placeholder", outputs=(_info([16, 32]),)),
        node("mm", "MatMul", ["a", "b"], outputs=(_info([8, 32]),)),
        node("img", "Placeholder", outputs=(_info([2, 10, 10, 3]),)),
        node("k", "Placeholder", outputs=(_info([3, 3, 3, 4]),)),
        node("conv", "Conv2D", ["img", "k"], outputs=(_info([2, 10, 10, 4]),)),
    )
    assert contraction_flops(g, g.node("mm")) == 2 * 8 * 32 * 16
    assert contraction_flops(g, g.node("conv")) == 2 * (2 * 10 * 10 * 4) * 27
    assert contraction_flops(g, g.node("a")) is None
    costs = static_costs(g, MachineModel(flops_per_s=1e9, memory_bytes_per_s=1e9))
    assert costs["mm"] == pytest.approx(2 * 8 * 32 * 16 / 1e9)
    assert costs["a"] == pytest.approx(8 * 16 * 4 / 1e9)  # bytes written


def test_measured_costs_give_fused_nodes_the_fused_op_time():
    g = training_graph()
    fallback = {name: 9.0 for name in g.nodes}
    # Grappler fused f1 into f2: only f2 appears in the trace.
    costs = measured_costs(g, {"f2": 0.5, "loss": 0.1}, fallback)
    assert costs["f2"] == 0.5 and costs["loss"] == 0.1
    assert costs["w"] == 9.0                     # no single traced consumer chain
    g2 = graph(node("a", "Op"), node("b", "Op", ["a"]), node("c", "Op", ["b"]))
    assert measured_costs(g2, {"c": 2.0}, {"a": 9.0, "b": 9.0, "c": 9.0}) == {"a": 2.0, "b": 2.0, "c": 2.0}
