"""Simulator accuracy: predicted vs measured peak for the built-in examples.

Each example runs in a fresh process on the emulated device (`device.run_with_budget`),
so every measurement starts from an empty BFC arena.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

__all__ = ["AccuracyRow", "DEFAULT_CASES", "measure_accuracy", "format_table"]

# (example, batch): one batch per example, asserted by the tests.
DEFAULT_CASES = (("mlp", 256), ("cnn", 64), ("resnet", 64), ("lstm", 64))
MEASURED_STEPS = 9


@dataclass(frozen=True)
class AccuracyRow:
    """One example's predicted and measured peak, in bytes (None where the run failed).

    measured_peak_bytes is the median over measured steps; measured_range_bytes
    their lowest and highest.
    """

    example: str
    batch: int
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


def _profile_example(name: str, batch: int) -> tuple[int, int, tuple[int, int]]:
    """Child-process side: profile one example; (predicted, median measured, (min, max) measured) bytes."""
    from seqmem.examples.steps import build_example
    from seqmem.runtime.profile import profile

    example = build_example(name, batch)
    result = profile(example.step, *example.make_inputs(0), measure=True, measured_steps=MEASURED_STEPS)
    measured = result.measured
    return result.predicted_peak_bytes, measured.median_bytes, (measured.min_bytes, measured.max_bytes)


def measure_accuracy(cases=DEFAULT_CASES, budget_mb: int = 4096, timeout_s: float = 300.0,
                     one_stream: bool = False) -> list[AccuracyRow]:
    """Profile each (example, batch) in `cases` in its own emulated-device process.

    one_stream: one op at a time (see `runtime.device`); the simulator then follows the executor's order.
    """
    rows = []
    for name, batch in cases:
        run = run_with_budget(_profile_example, name, batch, budget_mb=budget_mb, timeout_s=timeout_s,
                              one_stream=one_stream)
        predicted, measured, spread = run.value if run.ok else (None, None, None)
        rows.append(AccuracyRow(name, batch, predicted, measured, spread, run.verdict))
    return rows


def format_table(rows: list[AccuracyRow]) -> str:
    """The rows as a Markdown table (MB = 2**20 bytes)."""
    lines = [
        "| example | batch | predicted peak (MB) | measured peak, median (MB) | measured range (MB) "
        "| error vs median | error vs range |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.error is None:
            lines.append(f"| {row.example} | {row.batch} | - | - | - | {row.verdict} | - |")
        else:
            low, high = row.measured_range_bytes
            lines.append(
                f"| {row.example} | {row.batch} | {row.predicted_peak_bytes / MIB:.1f} | "
                f"{row.measured_peak_bytes / MIB:.1f} | {low / MIB:.1f}-{high / MIB:.1f} | {100 * row.error:+.1f}% "
                f"| {100 * row.error_to_range:+.1f}% |"
            )
    return "\n".join(lines)
