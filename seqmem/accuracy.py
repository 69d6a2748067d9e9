"""Simulator accuracy: predicted vs measured peak for the built-in examples.

Each example runs in a fresh process on the emulated device (`device.run_with_budget`),
so every measurement starts from an empty BFC arena.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqmem.device import run_with_budget

__all__ = ["AccuracyRow", "DEFAULT_CASES", "measure_accuracy", "format_table"]

# (example, batch): the table in the README.
DEFAULT_CASES = (("mlp", 256), ("cnn", 64), ("resnet", 128), ("lstm", 64))
_MB = 1 << 20


@dataclass(frozen=True)
class AccuracyRow:
    """One example's predicted and measured peak, in bytes (measured None if the run failed)."""

    example: str
    batch: int
    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    verdict: str

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if not self.predicted_peak_bytes or not self.measured_peak_bytes:
            return None
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes


def _profile_example(name: str, batch: int) -> tuple[int, int]:
    """Child-process side: profile one example and return (predicted, measured) bytes."""
    from seqmem.examples import build_example
    from seqmem.profile import profile

    example = build_example(name, batch)
    result = profile(example.step, *example.make_inputs(0), measure=True)
    return result.predicted_peak_bytes, result.measured_peak_bytes


def measure_accuracy(cases=DEFAULT_CASES, budget_mb: int = 4096, timeout_s: float = 300.0) -> list[AccuracyRow]:
    """Profile each (example, batch) in `cases` in its own emulated-device process."""
    rows = []
    for name, batch in cases:
        run = run_with_budget(_profile_example, name, batch, budget_mb=budget_mb, timeout_s=timeout_s)
        predicted, measured = run.value if run.ok else (None, None)
        rows.append(AccuracyRow(name, batch, predicted, measured, run.verdict))
    return rows


def format_table(rows: list[AccuracyRow]) -> str:
    """The rows as a Markdown table (MB = 2**20 bytes)."""
    lines = ["| example | batch | predicted peak (MB) | measured peak (MB) | error |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        if row.error is None:
            lines.append(f"| {row.example} | {row.batch} | - | - | {row.verdict} |")
        else:
            lines.append(
                f"| {row.example} | {row.batch} | {row.predicted_peak_bytes / _MB:.1f} | "
                f"{row.measured_peak_bytes / _MB:.1f} | {100 * row.error:+.1f}% |"
            )
    return "\n".join(lines)
