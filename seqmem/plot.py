"""PNG charts of predicted memory over one training step (the paper's Figure 1), free of TensorFlow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

from seqmem.analyze.analysis import StepAnalysis, as_planned
from seqmem.plan import swap_events
from seqmem.files import save_figure
from seqmem.sim.simulator import simulate
from seqmem.sim.trace import MemoryTrace
from seqmem.decisions.plan import Plan
from seqmem.units import MIB

__all__ = ["plot_memory_curves", "plot_plan", "serial_start_ms"]

_COLORS = ("0.3", "tab:blue", "tab:green", "tab:purple")


def plot_memory_curves(
    path: str,
    curves: Sequence[tuple[str, MemoryTrace, Mapping[str, float]]],
    *,
    title: str,
    loss_nodes: Sequence[str] = (),
    budget_bytes: Optional[int] = None,
    measured: Optional[tuple[str, int]] = None,
) -> str:
    """Write a PNG of each trace's predicted device memory (persistent + live bytes) over estimated time.

    curves: (label, trace, cost_s) triples: each trace's nodes run one at a time in its order, each taking
    its cost in `cost_s` (seconds), so that a curve goes forward in time whatever order it was simulated in.
    loss_nodes: shade the first curve's forward pass (up to the last loss to run) and backward pass.
    budget_bytes: draw the budget; measured: (label, bytes) of a measured peak to draw.
    The file appears whole or not at all. Returns `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for number, (label, trace, cost_s) in enumerate(curves):
        device = trace.busiest()
        times_ms = serial_start_ms(trace.order, cost_s)
        total_mb = [(device.persistent_bytes + live) / MIB for live in device.live_bytes]
        axes.step(times_ms, total_mb, where="post", color=_COLORS[number % len(_COLORS)], linewidth=1,
                  label=f"{label}: predicted peak {trace.peak_bytes / MIB:.0f} MB")
        if number == 0 and loss_nodes:
            loss_at = max(trace.order.index(node) for node in loss_nodes)
            forward = [step <= loss_at for step in range(len(trace.order))]
            axes.fill_between(times_ms, 0, total_mb, where=forward, step="post", color="tab:blue", alpha=0.3,
                              label="forward")
            axes.fill_between(times_ms, 0, total_mb, where=[not f for f in forward], step="post",
                              color="tab:orange", alpha=0.3, label="backward and update")
            axes.axhline(device.persistent_bytes / MIB, color="0.5", linestyle=":",
                         label="persistent (weights, inputs)")
    if budget_bytes is not None:
        axes.axhline(budget_bytes / MIB, color="0.4", linestyle="--", label=f"budget {budget_bytes / MIB:.0f} MB")
    if measured is not None:
        measured_label, measured_bytes = measured
        axes.axhline(measured_bytes / MIB, color="tab:red", linestyle="--", label=measured_label)
    axes.set_xlabel("estimated time in step, one op at a time (ms)")
    axes.set_ylabel("device memory (MB)")
    axes.set_title(title)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    return save_figure(figure, path)


def plot_plan(path: str, analysis: StepAnalysis, plan: Plan, *, title: str) -> str:
    """Write a PNG of the step's predicted memory before `plan` (as it runs) and after it (in the plan's
    pinned order, if it has one), BFC allocator model, with the budget. Returns `path`."""
    baseline = simulate(analysis.graph, analysis.order, allocator="bfc", **analysis.simulator_options())
    planned = as_planned(analysis, plan)
    after = simulate(planned.graph, planned.order, swap_events(plan, planned), allocator="bfc",
                     **planned.simulator_options())
    curves = [("without seqmem", baseline, analysis.timing.cost_s),
              (f"with seqmem ({len(plan.decisions)} swaps)", after, planned.timing.cost_s)]
    return plot_memory_curves(path, curves, title=title, budget_bytes=plan.budget_bytes)


def serial_start_ms(order: Sequence[str], cost_s: Mapping[str, float]) -> list[float]:
    """When each node of `order` starts, in ms, the nodes run one at a time, each taking its `cost_s`."""
    starts, now = [], 0.0
    for name in order:
        starts.append(1e3 * now)
        now += cost_s[name]
    return starts
