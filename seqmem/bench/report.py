"""Small pieces of the benchmarks' Markdown tables and JSON reports."""

from __future__ import annotations

from typing import Any, Callable

from seqmem.files import save_figure
from seqmem.runtime.device import BudgetRun
from seqmem.units import MIB

__all__ = ["EXECUTORS", "alternating_medians", "batch_chart", "measured_cell", "measured_heading", "median_run",
           "ratio", "search_settings", "value_or_verdict"]


EXECUTORS = ("one-stream", "pool")  # the emulated device's executor settings, as the benchmarks' --executor


def search_settings(args: dict[str, Any]) -> str:
    """How a benchmark's batches were found, from its recorded arguments: "trains two steps in each of
    3 fresh processes, real OOM, one stream"."""
    runs = args.get("runs", 1)
    where = "in a fresh process" if runs == 1 else f"in each of {runs} fresh processes"
    # reports without an executor were measured on the pool
    executor = "one stream" if args.get("executor", "pool") == "one-stream" else "TensorFlow's inter-op pool"
    return f"trains two steps {where}, real OOM, {executor}"


def ratio(numerator: Any, denominator: Any, digits: int = 2) -> str:
    """"1.50x" for numbers with a non-zero denominator, "-" otherwise (a verdict, a missing value)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (numerator, denominator))
    return f"{numerator / denominator:.{digits}f}x" if numbers and denominator else "-"


def measured_cell(cell: dict[str, Any], rate: str, unit: str, reference: Any) -> str:
    """One variant's measurement (`seqmem.bench.workload.measure` plus its `rate`) as a table cell:
    "306 (287), 14 swaps, 5482 tok/s (0.83x)", the ratio to `reference`, with every run's rate in brackets
    after it when `median_run` chose it from several; the verdict for a failed run."""
    if "error" in cell:
        return cell["error"]
    runs = [run[rate] for run in cell.get("runs", []) if "error" not in run]
    return (f"{cell['peak_bytes'] / MIB:.0f} ({cell['predicted_peak_bytes'] / MIB:.0f}), {cell['swaps']} swaps, "
            f"{cell[rate]:.0f} {unit} ({ratio(cell[rate], reference)})"
            + (f" [{' / '.join(f'{r:.0f}' for r in runs)}]" if len(runs) > 1 else ""))


def measured_heading(args: dict[str, Any], conserved: str) -> str:
    """The sentence above a benchmark's table of measured variants, from its recorded arguments (--at-batch,
    --measure-runs); `conserved` names the table's count of what each variant conserves."""
    runs = args.get("measure_runs", 1)
    return (f"At {'the batch given' if args.get('at_batch') else 'B_base'}, in an arena of twice the budget: "
            f"measured peak (predicted) in MB, {conserved}, target tokens/s (vs base)"
            + (f"; of {runs} fresh processes each, the one of median throughput, every run's in brackets"
               if runs > 1 else ""))


def median_run(cells: list[dict[str, Any]], rate: str) -> dict[str, Any]:
    """Of one variant's measurements in several fresh processes (`value_or_verdict` cells), the one of
    median `rate` (the lower middle one of an even count), with every cell, in run order, as "runs"; the
    first failure when no run succeeded. Raises ValueError for no cells."""
    if not cells:
        raise ValueError("median_run needs at least one measurement")
    ok = [cell for cell in cells if "error" not in cell]
    middle = sorted(ok, key=lambda cell: cell[rate])[(len(ok) - 1) // 2] if ok else cells[0]
    return {**middle, "runs": cells}


def alternating_medians(measure: Callable[[str], dict[str, Any]], variants: list[str], runs: int,
                        rate: str) -> dict[str, dict[str, Any]]:
    """{variant: `median_run` of `runs` cells `measure(variant)`}, the variants measured in turn, round after
    round, so that a slower spell of the machine hits each alike."""
    rounds = [{variant: measure(variant) for variant in variants} for _ in range(runs)]
    return {variant: median_run([round_[variant] for round_ in rounds], rate) for variant in variants}


def value_or_verdict(run: BudgetRun) -> dict[str, Any]:
    """A fresh-process run's result for a JSON report: its value, or its verdict and the end of its message."""
    return run.value if run.ok else {"error": run.verdict, "message": run.message[-500:]}


def batch_chart(path: str, rows: list[dict[str, Any]], x_key: str, x_label: str, title: str) -> str:
    """PNG of a benchmark report's largest batch per variant (each row's "batch": {variant: batch}) against
    each row's `x_key`, on a log scale (0 drawn as 0.5); appears whole or not at all. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for variant in rows[0]["batch"] if rows else ():
        axes.plot([row[x_key] for row in rows], [max(row["batch"][variant], 0.5) for row in rows], marker="o",
                  label=variant)
    axes.set_yscale("log")
    axes.set_xlabel(x_label)
    axes.set_ylabel("largest batch that trains")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    return save_figure(figure, path)
