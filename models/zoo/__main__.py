"""The zoo: seqmem on training steps the project did not write, each optimized to a share of its own peak.

Per model (`models.zoo.steps.STEPS`), on the emulated device with one stream
and op determinism, each job in a fresh process:

1. the original step trains `--steps` calls in an arena of --arena-mb: its
   measured peak, seqmem's prediction of it, the loss seqmem finds, its losses
   and final variables;
2. the budget is `--fraction` of that measured peak (MiB, rounded down), and in
   each of `--runs` fresh processes whose arena is the budget itself,
   `seqmem.optimize(step, budget)` is called and the step it returns trains the
   same calls: within the budget when no call ran out of memory and every
   call's peak is at most the budget; bit for bit when its losses and final
   variables equal the original's.

The data-parallel step (`models.zoo.workers`) runs the same way as two
`MultiWorkerMirroredStrategy` worker processes; its peaks are the higher of
the two workers'. Arenas grow as TensorFlow's CPU arena does, or with
`--reserved-arena` are reserved up front, as a GPU's is by default.

    python -m models.zoo                    # every step, 3 optimized runs each
    python -m models.zoo --quick            # the quick subset at smaller batches, 1 run each
    python -m models.zoo --models resnet50,tfa_luong --runs 1
    python -m models.zoo --reserved-arena   # every arena reserved up front, as a GPU's
    python -m models.zoo --models mobilenet_v3_small --runs 1 --grappler-off arithmetic_optimization
    python -m models.zoo --models inception_v3 --runs 1 --original-runs 3   # does the original repeat itself?
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from seqmem.bench.batch_search import PROBE_STALL_S
from seqmem.files import write_json, write_text
from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

from models.zoo import jobs, workers
from models.zoo.steps import STEPS

_ARENA_MB = 4096  # the original's arena: room for any zoo step as written
_TIMEOUT_S = 900.0
# Grappler's optimizers that `tf.config.optimizer.set_experimental_options` switches, by its names
GRAPPLER_OPTIMIZERS = ("arithmetic_optimization", "constant_folding", "debug_stripper", "dependency_optimization",
                       "function_optimization", "implementation_selector", "layout_optimizer", "loop_optimization",
                       "pin_to_host_optimization", "remapping", "shape_optimization")


def run_model(name: str, batch: int, fraction: float, runs: int, steps: int, arena_mb: int = _ARENA_MB,
              grappler_off: tuple[str, ...] = (), original_runs: int = 1, reserved_arena: bool = False) -> dict:
    """Both jobs for one zoo model: {"original": its result or verdict, "budget_mb", "optimized": [each run's
    result or verdict]}, and with `original_runs` > 1 "original_again": the original's further fresh runs. A
    verdict is {"verdict": ..., "message": ...}. The data-parallel steps (`models.zoo.workers.STEPS`) run as
    two worker processes each, at their own batch. grappler_off: Grappler optimizers switched off in both
    jobs (`jobs.original`); neither option is for the data-parallel steps. reserved_arena: every process's
    arena reserved up front, as a GPU's is by default (`seqmem.runtime.device`), instead of grown."""
    if name in workers.STEPS:
        if grappler_off or original_runs > 1:
            raise ValueError(f"grappler_off and original_runs are not supported for the data-parallel step {name!r}")
        return workers.run_model(name, fraction, runs, steps, arena_mb, reserved_arena)

    def run_original() -> dict:
        return _value(run_with_budget(jobs.original, name, batch, steps, grappler_off, budget_mb=arena_mb,
                                      timeout_s=_TIMEOUT_S, stall_s=PROBE_STALL_S, reserved_arena=reserved_arena))

    original = run_original()
    row: dict[str, Any] = {"model": name, "family": STEPS[name].family, "batch": batch, "original": original}
    if "verdict" in original:
        return row
    if original_runs > 1:
        row["original_again"] = [run_original() for _ in range(original_runs - 1)]
    budget_mb = math.floor(fraction * original["peak_bytes"] / MIB)
    row["budget_mb"] = budget_mb
    row["optimized"] = [_value(run_with_budget(jobs.optimized, name, batch, budget_mb, steps, grappler_off,
                                               budget_mb=budget_mb, timeout_s=_TIMEOUT_S, stall_s=PROBE_STALL_S,
                                               reserved_arena=reserved_arena))
                        for _ in range(runs)]
    return row


def _value(run) -> dict:
    return run.value if run.ok else {"verdict": run.verdict, "message": run.message[-600:]}


def verdicts(row: dict) -> dict[str, Any]:
    """What a row shows: loss found correctly (original and every run), runs within the budget, runs bit
    for bit, and the prediction errors (measured / predicted - 1) of the original and of each run."""
    original, runs = row["original"], row.get("optimized", [])
    budget = row.get("budget_mb", 0) * MIB
    trained = [run for run in runs if "losses" in run]
    return {
        "loss_correct": bool(original.get("loss_correct")) and all(run.get("loss_correct") for run in trained),
        "within_budget": sum(run["peak_bytes"] <= budget for run in trained),
        "bit_for_bit": sum(_trained_alike(run, original) for run in trained),
        "original_error": _error(original),
        "optimized_errors": [_error(run) for run in trained],
    }


def _error(result: dict) -> float | None:
    """Predicted / measured - 1: how far seqmem's prediction of the peak is from what was measured."""
    if "peak_bytes" not in result:
        return None
    return result["predicted_peak_bytes"] / result["peak_bytes"] - 1


def markdown(rows: list[dict], runs: int) -> str:
    """The zoo's table: one row per model, then the sums each original adds as their terms arrive and the
    originals whose calls all returned one loss."""
    lines = ["| model | family | batch | loss found | original MB: measured, its calls' lowest-highest (predicted) | "
             "budget MB | "
             f"optimized MB: measured (predicted), of {runs} | within budget | bit for bit | decisions | "
             "optimize s | step time vs original |",
             "|---|---|---:|---|---|---:|---|---|---|---:|---:|---:|"]
    for row in rows:
        lines.append(_markdown_row(row, runs))
    arrival = [f"{row['model']} ({', '.join(row['original']['arrival_sums'])})" for row in rows
               if row["original"].get("arrival_sums")]
    if arrival:
        lines += ["", "Sums the original adds as their terms arrive (Grappler's memory optimizer; seqmem's step adds "
                      "them in graph order): " + "; ".join(arrival) + "."]
    unchanged = [row["model"] for row in rows if len(row["original"].get("losses", ())) > 1
                 and len(set(row["original"]["losses"])) == 1]
    if unchanged:
        lines += ["", "Originals whose calls all returned one loss (the calls' updates skipped, as a loss scale "
                      "that overflows skips them, or without effect on it; bit for bit then compares no update): "
                      + ", ".join(unchanged) + "."]
    again = [f"{row['model']} {_same_as_original(row)}/{len(row['original_again'])}" for row in rows
             if row.get("original_again")]
    if again:
        lines += ["", "Further fresh runs of the original whose losses and variables equal its first run's: "
                      + "; ".join(again) + "."]
    return "\n".join(lines)


def _same_as_original(row: dict) -> int:
    """How many of the original's further runs trained to its first run's losses and variables."""
    return sum(_trained_alike(run, row["original"]) for run in row["original_again"])


def _trained_alike(run: dict, original: dict) -> bool:
    """Whether `run` trained to `original`'s losses and variables (a run that did not train did not)."""
    return "losses" in run and run["losses"] == original.get("losses") and run.get("digest") == original.get("digest")


def _markdown_row(row: dict, runs: int) -> str:
    original = row["original"]
    head = f"| {row['model']} | {row['family']} | {row['batch']} |"
    if "verdict" in original:
        return f"{head} original: {original['verdict']} | | | | | | | | |"
    shown = verdicts(row)
    trained = [run for run in row["optimized"] if "losses" in run]
    failed = [run for run in row["optimized"] if "losses" not in run]
    loss = f"{original['loss']} ({'yes' if shown['loss_correct'] else 'NO'})"
    measured = " / ".join(f"{run['peak_bytes'] / MIB:.1f} ({run['predicted_peak_bytes'] / MIB:.1f})" for run in trained)
    failures = [_failure(run, row["budget_mb"]) for run in failed]
    shown_failures = [text if failures.count(text) == 1 else f"{text} ({failures.count(text)}x)"
                      for text in dict.fromkeys(failures)]
    measured = "; ".join([measured] * bool(measured) + shown_failures)
    decisions = "/".join(sorted({f"{run['decisions']}+{run['loop_swaps']}" for run in trained})) or "-"
    optimize_s = "/".join(f"{run['optimize_s']:.0f}" for run in row["optimized"] if "optimize_s" in run) or "-"
    speed = "/".join(f"{original['step_s'] / run['step_s']:.2f}x" for run in trained) or "-"
    calls = original.get("peaks") or [original["peak_bytes"]]
    predicted = original["predicted_peak_bytes"] / MIB
    return (f"{head} {loss} | {min(calls) / MIB:.1f}-{max(calls) / MIB:.1f} ({predicted:.1f}) | "
            f"{row['budget_mb']} | {measured} | {shown['within_budget']}/{runs} | {shown['bit_for_bit']}/{runs} | "
            f"{decisions} | {optimize_s} | {speed} |")


def _failure(run: dict, budget_mb: int) -> str:
    """A failed run in a few words: the InfeasibleBudgetError's floor (the lowest predicted peak, the op at
    it, and what it is made of; after "not placed" where the plans' buffers, not their bytes, did not fit;
    "the step's working set" where what lives through the step and the op's own working set are over the
    budget of `budget_mb` MiB without anything held, so that no plan of any kind fits) or, without one, its
    first clause; or the verdict and the last line of its message."""
    floor = run.get("floor")
    unplaced = "not placed (ran out of memory as the allocator model foresaw); " if run.get("unplaced") else ""
    if floor:
        held = floor["largest_held"][0] if floor["largest_held"] else None
        largest = "" if held is None else (f"; largest held {held['tensor']}, {held['size_bytes'] / MIB:.1f} MB "
                                           f"({held['why'].split(':')[0]})")
        until = floor.get("until", floor["op"])
        lasting = "" if until == floor["op"] else f" until {floor['until_type']} {until!r}"
        working_set = floor["persistent_bytes"] + floor["working_bytes"]
        over = (f" (the first two, {working_set / MIB:.1f} MB, over the budget: the step's working set)"
                if working_set > budget_mb * MIB else "")
        return (f"{unplaced}floor {floor['peak_bytes'] / MIB:.1f} MB at {floor['op_type']} {floor['op']!r}{lasting}: "
                f"{floor['persistent_bytes'] / MIB:.1f} live through the step + {floor['working_bytes'] / MIB:.1f} "
                f"the op's working set + {floor['held_bytes'] / MIB:.1f} held{over}{largest}")
    if "infeasible" in run:
        return unplaced + "infeasible: " + run["infeasible"].split("; budget was")[0][:200]
    lines = run["message"].strip().splitlines()
    return f"{run['verdict']}: {lines[-1][:160] if lines else ''}"


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the quick subset at its smaller batches, 1 run each")
    parser.add_argument("--models", help="comma-separated names (default: every step, or the quick subset)")
    parser.add_argument("--fraction", type=float, default=0.7, help="the budget, a share of the original's peak")
    parser.add_argument("--runs", type=_positive_int,
                        help="optimized runs per model, each a fresh process (default 3; 1 quick)")
    parser.add_argument("--steps", type=_positive_int, default=3, help="training calls per run")
    parser.add_argument("--original-runs", type=_positive_int, default=1,
                        help="fresh runs of each original (default 1); the others are compared with the first")
    parser.add_argument("--out", default="zoo-output", help="folder for zoo.json and zoo.md")
    parser.add_argument("--grappler-off", default="", metavar="NAMES",
                        help="comma-separated Grappler optimizers to switch off in both jobs, to find one that "
                             f"changes values ({', '.join(GRAPPLER_OPTIMIZERS)})")
    parser.add_argument("--reserved-arena", action="store_true",
                        help="reserve each emulated device's arena up front, as a GPU's, instead of growing it")
    args = parser.parse_args(argv)
    grappler_off = tuple(name for name in args.grappler_off.split(",") if name)
    unknown_optimizers = [name for name in grappler_off if name not in GRAPPLER_OPTIMIZERS]
    if unknown_optimizers:
        parser.error(f"unknown Grappler optimizers {', '.join(unknown_optimizers)}; "
                     f"expected some of {', '.join(GRAPPLER_OPTIMIZERS)}")
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction must be in (0, 1], got {args.fraction}")
    every = [*STEPS, *workers.STEPS]
    names = args.models.split(",") if args.models else [n for n, m in STEPS.items() if m.quick_batch or not args.quick]
    if not args.models and not args.quick:
        names += list(workers.STEPS)
    unknown = [name for name in names if name not in every]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; the zoo has {', '.join(every)}")
    single_process_only = [flag for flag, given in (("--grappler-off", grappler_off),
                                                    ("--original-runs", args.original_runs > 1)) if given]
    if single_process_only and any(name in workers.STEPS for name in names):
        parser.error(f"{' and '.join(single_process_only)} is for the single-process steps; name them with --models")
    runs = args.runs or (1 if args.quick else 3)
    rows = []
    for name in names:
        model = STEPS.get(name)
        batch = model and (model.quick_batch if args.quick and model.quick_batch else model.batch)
        rows.append(run_model(name, batch, args.fraction, runs, args.steps, grappler_off=grappler_off,
                              original_runs=args.original_runs, reserved_arena=args.reserved_arena))
        print(_markdown_row(rows[-1], runs), flush=True)
    os.makedirs(args.out, exist_ok=True)
    write_json({"args": vars(args), "rows": rows}, os.path.join(args.out, "zoo.json"))
    table = markdown(rows, runs)
    write_text(table + "\n", os.path.join(args.out, "zoo.md"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
