"""Small pieces of the benchmarks' Markdown tables and JSON reports."""

from __future__ import annotations

from typing import Any

from seqmem.runtime.device import BudgetRun

__all__ = ["ratio", "value_or_verdict"]


def ratio(numerator: Any, denominator: Any, digits: int = 2) -> str:
    """"1.50x" for numbers with a non-zero denominator, "-" otherwise (a verdict, a missing value)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (numerator, denominator))
    return f"{numerator / denominator:.{digits}f}x" if numbers and denominator else "-"


def value_or_verdict(run: BudgetRun) -> dict[str, Any]:
    """A fresh-process run's result for a JSON report: its value, or its verdict and the end of its message."""
    return run.value if run.ok else {"error": run.verdict, "message": run.message[-500:]}
