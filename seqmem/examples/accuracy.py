"""Simulator accuracy: predicted vs measured peak for the built-in examples.

Each example runs in a fresh process on the emulated device (`device.run_with_budget`),
so every measurement starts from an empty BFC arena. On one compute stream each
example is measured twice: as it is (the executor's own order, which the
prediction takes from a profiled call, as `seqmem.profile` does) and as `optimize`
runs it: pinned to its planned schedule (`seqmem.rewrite.pin`), its while loops
bounded to one iteration at a time (`seqmem.edge.loops`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

__all__ = ["AccuracyRow", "DEFAULT_CASES", "measure_accuracy", "format_table"]

# (example, batch): one batch per example, asserted by the tests.
DEFAULT_CASES = (("mlp", 256), ("cnn", 64), ("resnet", 64), ("lstm", 64))
MEASURED_STEPS = 7


@dataclass(frozen=True)
class AccuracyRow:
    """One example's predicted and measured peak, in bytes (None where the run failed).

    order: "as is" (the executor's order) or "pinned" (to the planned schedule, loops bounded, as
    `optimize` runs the step).
    measured_peak_bytes is the median over measured steps; measured_range_bytes
    their lowest and highest.
    """

    example: str
    batch: int
    order: str
    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    measured_range_bytes: tuple[int, int] | None
    verdict: str

    @property
    def error(self) -> float | None:
        """(predicted - median measured) / median measured."""
        if not self.predicted_peak_bytes or not self.measured_peak_bytes:
            return None
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    @property
    def error_to_range(self) -> float | None:
        """Relative distance from the prediction to the nearest measured step's peak (0 inside the range)."""
        if not self.predicted_peak_bytes or not self.measured_range_bytes:
            return None
        low, high = self.measured_range_bytes
        nearest = min(max(self.predicted_peak_bytes, low), high)
        return (self.predicted_peak_bytes - nearest) / nearest


def _measure_example(name: str, batch: int) -> list[tuple[str, int, int, tuple[int, int]]]:
    """Child-process side: (order, predicted, median measured, (min, max) measured) bytes, as it is and,
    where the step can be pinned, pinned with its loops bounded to one iteration."""
    from seqmem.plan import choose_conservations, simulate_baseline
    from seqmem.edge import loops
    from seqmem.edge.capture import concrete_function, to_graph_def
    from seqmem.edge.swap_nodes import EmulatedDeviceBackend
    from seqmem.examples.steps import build_example
    from seqmem.runtime.optimized_step import build_step
    from seqmem.edge.op_trace import trace_ops
    from seqmem.runtime.measure import captured_variables, variables_restored
    from seqmem.runtime.profile import measure_step_peak
    from seqmem.runtime.step_analysis import analyze_function

    example = build_example(name, batch)
    args = example.make_inputs(0)
    function = concrete_function(example.step, args)
    analysis = analyze_function(function, measure_scratch=True)
    steps = {}  # order -> (its analysis, made when it is measured; the step)
    if analysis.pinned_order:  # measured first, in the arena as the analysis left it, as `optimize` runs it
        plan = choose_conservations(analysis, 1 << 50, pinned=True).fitting_plan()  # no swaps: the order alone
        if loops.loops_above(to_graph_def(analysis.graph), 1):  # the simulator runs one iteration at a time
            plan = dataclasses.replace(plan, loop_parallel_iterations=1)
        steps["pinned"] = (analysis.pinned, build_step(analysis, plan, EmulatedDeviceBackend(), function, example.step))

    def as_it_ran():  # in the order it is seen running in, as `seqmem.profile` predicts a step it runs
        with variables_restored(captured_variables(function)):
            return analysis.as_ran(trace_ops(example.step, args, runs=1).started)

    steps["as is"] = (as_it_ran, example.step)
    rows = []
    for order, (analysis_of, step) in steps.items():
        predicted = simulate_baseline(analysis_of()).trace.peak_bytes
        measured = measure_step_peak(step, args, function, MEASURED_STEPS)
        rows.append((order, predicted, measured.median_bytes, (measured.min_bytes, measured.max_bytes)))
    return rows


def measure_accuracy(cases=DEFAULT_CASES, budget_mb: int = 4096, timeout_s: float = 300.0,
                     one_stream: bool = True, reserved_arena: bool = False) -> list[AccuracyRow]:
    """Profile each (example, batch) in `cases` in its own emulated-device process.

    one_stream: one op at a time (see `runtime.device`), the simulator following the executor's order;
    False: TensorFlow's default inter-op pool. reserved_arena: the arena reserved up front, not grown.
    """
    rows = []
    for name, batch in cases:
        run = run_with_budget(_measure_example, name, batch, budget_mb=budget_mb, timeout_s=timeout_s,
                              one_stream=one_stream, reserved_arena=reserved_arena)
        if not run.ok:
            rows.append(AccuracyRow(name, batch, "as is", None, None, None, run.verdict))
            continue
        rows += [AccuracyRow(name, batch, *measured, run.verdict) for measured in run.value]
    return rows


def format_table(rows: list[AccuracyRow]) -> str:
    """The rows as a Markdown table (MB = 2**20 bytes)."""
    lines = [
        "| example | batch | order | predicted peak (MB) | measured peak, median (MB) | measured range (MB) "
        "| error vs median | error vs range |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.error is None:
            lines.append(f"| {row.example} | {row.batch} | {row.order} | - | - | - | {row.verdict} | - |")
        else:
            low, high = row.measured_range_bytes
            lines.append(
                f"| {row.example} | {row.batch} | {row.order} | {row.predicted_peak_bytes / MIB:.1f} | "
                f"{row.measured_peak_bytes / MIB:.1f} | {low / MIB:.1f}-{high / MIB:.1f} | {100 * row.error:+.1f}% "
                f"| {100 * row.error_to_range:+.1f}% |"
            )
    return "\n".join(lines)
