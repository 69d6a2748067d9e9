import pytest

from seqmem import plot
from seqmem.analyze.analysis import analyze_graph
from seqmem.sim.simulator import simulate
from tests.builders import training_graph


def test_nodes_run_one_at_a_time_start_when_the_ones_before_them_are_done():
    assert plot.serial_start_ms(["b", "a", "c"], {"a": 1e-3, "b": 2e-3, "c": 5e-4}) == pytest.approx([0, 2, 3])


def test_a_curve_goes_forward_in_time_in_an_order_that_is_not_by_earliest_start(monkeypatch, tmp_path):
    analysis = analyze_graph(training_graph())
    start = analysis.timing.start_s
    # the constants run late, after the ops that start before them at the earliest
    order = [name for name in analysis.order if name not in ("w", "ones")]
    order.insert(order.index("f1"), "w")
    order.insert(order.index("gradient_tape/g2"), "ones")
    assert any(start[later] < start[earlier] for earlier, later in zip(order, order[1:]))
    figures = []
    monkeypatch.setattr(plot, "save_figure", lambda figure, path: figures.append(figure) or path)
    trace = simulate(analysis.graph, order)
    plot.plot_memory_curves(str(tmp_path / "curve.png"), [("as run", trace, analysis.timing.cost_s)],
                            title="t", loss_nodes=[ref.node for ref in analysis.anatomy.losses])
    (line,) = figures[0].axes[0].lines[:1]
    times = list(line.get_xdata())
    assert len(times) == len(order) and times == sorted(times)
