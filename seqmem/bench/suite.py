"""A sequence model's benchmark: the largest batch of each variant at each sequence length, and peak and
throughput at B_base, each probe a fresh emulated-device process (the paper's Table 1(a) and 2(b) form).

A benchmark (`models/nmt/benchmark.py`, `models/transformer/benchmark.py`) describes itself as a `Suite`
and its flags with `add_arguments`; `run` searches, measures and reports. The suite's module defines, at
module level (children unpickle functions by module name):

    workload(variant, time_steps, *model, budget_mb) -> seqmem.bench.workload.Workload
    measure(variant, batch, time_steps, *model, budget_mb) -> dict   (child process: `workload.measure`'s
                                                                     fields plus "tokens_per_s")

where `model` is the values of the suite's `model_fields` flags.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from seqmem.bench.batch_search import largest_batch
from seqmem.bench.report import (EXECUTORS, alternating_medians, batch_chart, measured_cell, measured_heading, ratio,
                                 search_settings, value_or_verdict)
from seqmem.bench.workload import predicted_batch, trains
from seqmem.files import write_json
from seqmem.runtime.device import run_with_budget

__all__ = ["Suite", "add_arguments", "checked_arguments", "format_report", "run"]


@dataclass(frozen=True)
class Suite:
    """name: the files' stem (`<name>-benchmark.json`, `<name>-batch.png`); module: the importable module
    defining `workload` and `measure` (module docstring); columns: variant -> its column's heading, "base"
    first; model_fields: the flags (argparse names) holding the model's sizes, in `workload`'s order;
    chart_title: the batch chart's title, `{budget_mb}` filled in."""

    name: str
    module: str
    columns: dict[str, str]
    model_fields: tuple[str, ...]
    chart_title: str

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.columns)


def add_arguments(parser: argparse.ArgumentParser, suite: Suite, *, time_steps: str, executor: str) -> None:
    """The flags every suite takes (its own model flags are the caller's): `time_steps` and `executor` defaults."""
    parser.add_argument("--time-steps", default=time_steps, help="comma-separated sequence lengths")
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=2048)
    parser.add_argument("--precision", type=float, default=0.05,
                        help="stop the batch search once the answer is known within this fraction (0: exact)")
    parser.add_argument("--timeout-s", type=int, default=1800, help="limit for one probe process")
    parser.add_argument("--executor", choices=EXECUTORS, default=executor, help="the emulated device's executor")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes a batch must train in to count as fitting")
    parser.add_argument("--jobs", type=int, default=1,
                        help="probe processes side by side in batch searches (more than 1 changes the order ops run in)")
    parser.add_argument("--at-batch", type=int,
                        help="skip the batch searches: measure every variant at this batch instead of at B_base")
    parser.add_argument("--measure-runs", type=int, default=1,
                        help="fresh processes per variant for the peak and throughput at B_base (or --at-batch)")
    parser.add_argument("--variants", default=",".join(suite.variants),
                        help=f"comma-separated variants to run, base among them (default: all {len(suite.variants)})")
    parser.add_argument("--out", default=f"{suite.name}-benchmark", help="folder for the JSON and the PNG")


def checked_arguments(parser: argparse.ArgumentParser, suite: Suite,
                      args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """(sequence lengths, variants in the suite's order) from `add_arguments`' flags; exits through
    `parser.error` for a value out of range."""
    named = {v.strip() for v in args.variants.split(",") if v.strip()}
    if "base" not in named or not named <= set(suite.variants):
        parser.error(f"--variants must name base and any of {list(suite.variants)}, got {args.variants!r}")
    try:
        time_steps = [int(t) for t in args.time_steps.split(",")]
    except ValueError:
        parser.error(f"--time-steps must be comma-separated integers, got {args.time_steps!r}")
    model = [getattr(args, field) for field in suite.model_fields]
    if min([args.budget_mb, args.max_batch, args.timeout_s, args.jobs, args.runs, args.measure_runs,
            1 if args.at_batch is None else args.at_batch] + model + time_steps) < 1:
        parser.error(f"time steps, budget, {', '.join(suite.model_fields)}, batch limit, timeout, jobs, runs and "
                     "--at-batch must be positive")
    if not 0 <= args.precision < 1:
        parser.error(f"--precision must be in [0, 1), got {args.precision}")
    return time_steps, [v for v in suite.variants if v in named]


def run(suite: Suite, args: argparse.Namespace, time_steps: list[int], variants: list[str]) -> str:
    """Search and measure every variant at every length, write `<out>/<name>-benchmark.json` after each
    length and the chart at the end (not for --at-batch); returns the tables and the files written, for the
    benchmark script to print."""
    bench = importlib.import_module(suite.module)
    os.makedirs(args.out, exist_ok=True)
    report_path = os.path.join(args.out, f"{suite.name}-benchmark.json")
    report: dict[str, Any] = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "rows": []}
    model = [getattr(args, field) for field in suite.model_fields]
    with tqdm(desc="probe processes", unit="run", file=sys.stderr) as progress:
        for steps in time_steps:
            row: dict[str, Any] = {"time_steps": steps, "batch": {}, "notes": {}, "at_base": {}}
            if args.at_batch is None:
                _search_batches(bench, row, steps, model, variants, args, progress)
            row["measured_at"] = args.at_batch if args.at_batch is not None else row["batch"]["base"]

            def measure_variant(variant):
                progress.update(1)
                return value_or_verdict(run_with_budget(
                    bench.measure, variant, row["measured_at"], steps, *model, args.budget_mb,
                    budget_mb=2 * args.budget_mb, timeout_s=args.timeout_s, one_stream=args.executor == "one-stream"))

            if row["measured_at"]:
                row["at_base"] = alternating_medians(measure_variant, variants, args.measure_runs, "tokens_per_s")
            report["rows"].append(row)
            write_json(report, report_path)  # each row as soon as it is measured

    written = write_json(report, report_path)
    if args.at_batch is None:
        written += " and " + batch_chart(
            os.path.join(args.out, f"{suite.name}-batch.png"), report["rows"], "time_steps",
            "time steps T (source and target)", suite.chart_title.format(budget_mb=args.budget_mb))
    return f"{format_report(suite, report)}\nwrote {written}"


def _search_batches(bench: Any, row: dict[str, Any], steps: int, model: list, variants: list[str],
                    args: argparse.Namespace, progress: tqdm) -> None:
    """Fill `row`'s "batch" and "notes" with each variant's largest batch at `steps` time steps (B_base
    first: the other variants' searches start there)."""
    one_stream = args.executor == "one-stream"
    guess = run_with_budget(predicted_batch, bench.workload("base", steps, *model, args.budget_mb), args.budget_mb,
                            budget_mb=args.budget_mb, timeout_s=args.timeout_s, one_stream=one_stream)
    progress.update(1)

    def search(variant, start):
        def probed(batch, verdict):
            progress.set_postfix_str(f"T {steps}, {variant} at batch {batch}: {verdict}", refresh=False)
            progress.update(1)

        return largest_batch(trains, bench.workload(variant, steps, *model, args.budget_mb), budget_mb=args.budget_mb,
                             limit=args.max_batch, start=min(max(start, 1), args.max_batch),
                             precision=args.precision, runs=args.runs, one_stream=one_stream,
                             timeout_s=args.timeout_s, on_probe=probed)

    found = {"base": search("base", guess.value if guess.ok else 1)}
    base = found["base"].batch
    # the other variants start from B_base and are independent: probe them side by side
    others = [v for v in variants if v != "base"]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        found.update(zip(others, pool.map(lambda variant: search(variant, base), others)))
    for variant in found:
        row["batch"][variant], row["notes"][variant] = found[variant].batch, found[variant].notes


def format_report(suite: Suite, report: dict[str, Any]) -> str:
    """The benchmark's tables in Markdown, from its JSON report (no batch table for a run with --at-batch)."""
    args = report["args"]
    lines = []
    searched = [row for row in report["rows"] if row["batch"]]
    model = ", ".join(f"{field.replace('_', ' ')} {args[field]}" for field in suite.model_fields)
    if searched:
        lines += [f"Largest batch that {search_settings(args)}, emulated device {args['budget_mb']} MB, "
                  f"{model}; ratio to B_base in parentheses",
                  "| T | " + " | ".join(suite.columns.values()) + " |", "|---:" * (len(suite.columns) + 1) + "|"]
    for row in searched:
        batch = row["batch"]
        cells = [str(batch["base"])] + [f"{batch[v]} ({ratio(batch[v], batch['base'])})" if v in batch else "-"
                                        for v in suite.variants[1:]]
        lines.append(f"| {row['time_steps']} | " + " | ".join(cells) + " |")
    lines += [""] if lines else []
    lines += [measured_heading(args, "swaps"),
              "| T | batch | " + " | ".join(suite.variants) + " |", "|---:|---:" + "|---" * len(suite.variants) + "|"]
    for row in report["rows"]:
        measured = row["at_base"]
        if not measured:
            continue
        reference = measured["base"].get("tokens_per_s")
        cells = [measured_cell(measured.get(variant, {"error": "-"}), "tokens_per_s", "tok/s", reference)
                 for variant in suite.variants]
        batch = row.get("measured_at", row["batch"].get("base"))  # reports before --at-batch: B_base
        lines.append(f"| {row['time_steps']} | {batch} | " + " | ".join(cells) + " |")
    for row in report["rows"]:
        for variant, notes in row["notes"].items():
            lines += [f"note (T={row['time_steps']}, {variant}): {note}" for note in notes]
    return "\n".join(lines)
