"""Measured peaks of a loop-heavy training step: loops as traced, bounded to one iteration at a time, and
bounded with every swappable loop accumulator in host memory.

Steps: "tfa" and "efficient" (the NMT step, T=50, --batch 8, 256 units,
vocabulary 1000, with tfa's or seqmem's attention) and "lstm" (the built-in
lstm example, batch 64).
"Bounded" is `seqmem.optimize` at a budget the step fits (no swaps, every loop
at `loop_parallel_iterations=1`); "bounded, lists swapped" adds
`seqmem.edge.loop_swap` on every accumulator it can swap, as `optimize` does
for a budget the bounded step exceeds. Each setting runs in --runs fresh
emulated-device processes (2048 MB); each process reports the lowest, median
and highest peak of --steps steps after a warm-up, the median step time, and
seqmem's predicted peak (with every list swapped for the third setting, as
`optimize` plans it).

    python -m models.nmt.loop_peaks                         # all three, 3 runs of 8 steps, one stream
    python -m models.nmt.loop_peaks --executor pool --steps-of tfa
    python -m models.nmt.loop_peaks --steps-of tfa,efficient --batch 223   # the benchmark's B_base, T = 50
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

from seqmem.bench.report import EXECUTORS
from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

STEPS = ("tfa", "efficient", "lstm")
LOOP_SETTINGS = ("as traced", "bounded to 1", "bounded, lists swapped")
_DEVICE_MB = 2048


def peaks(step_name: str, loops: str, steps: int, batch: int = 8) -> dict[str, Any]:
    """Child process: measured peaks (bytes) and median seconds of `steps` steps with `loops` (one of
    LOOP_SETTINGS), and the predicted peak of the step as traced; `batch` of the NMT steps."""
    from seqmem.analyze.analysis import as_planned
    from seqmem.plan import loop_swapped, simulate_baseline
    from seqmem.runtime.measure import timed_steps
    from seqmem.runtime.optimize import optimize
    from seqmem.runtime.optimized_step import build_step

    if step_name == "lstm":
        from seqmem.examples.steps import build_example

        example = build_example("lstm", 64)
        step, inputs, specs = example.step, example.make_inputs(0), example.input_specs
    else:
        from models.nmt.benchmark import training_step

        step, inputs, specs = training_step(batch, 50, 256, vocab=1000, attention=step_name)
    optimized = optimize(step, 1e5, input_signature=specs, sample_inputs=inputs, calibrate=False,
                         loop_parallel_iterations=None if loops == "as traced" else 1)
    run, predicted = optimized, optimized.plan.predicted_peak_before_bytes
    if loops == "bounded, lists swapped":
        every_list = dataclasses.replace(optimized.plan, loop_swaps=optimized.analysis.loop_swaps)
        run = build_step(optimized.analysis, every_list, optimized.backend, optimized.function, step)
        planned = as_planned(optimized.analysis, optimized.plan)  # as it runs: barriers split, pinned
        swapped = loop_swapped(planned, planned.loop_swaps, depth=1)
        predicted = simulate_baseline(swapped).trace.peak_bytes
    measured, seconds = timed_steps(run, inputs, steps)
    return {"peak_bytes": measured, "median_step_s": statistics.median(seconds), "predicted_peak_bytes": predicted}


def format_row(step_name: str, loops: str, run: int, result: dict[str, Any]) -> str:
    """One Markdown table row of a process's result (MB, ms)."""
    measured = sorted(result["peak_bytes"])
    return (f"| {step_name} | {loops} | {run} | {measured[0] / MIB:.1f} | {statistics.median(measured) / MIB:.1f} | "
            f"{measured[-1] / MIB:.1f} | {result['predicted_peak_bytes'] / MIB:.1f} | "
            f"{1e3 * result['median_step_s']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-of", default=",".join(STEPS), help=f"comma-separated, of {list(STEPS)}")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per step and loop setting")
    parser.add_argument("--steps", type=int, default=8, help="measured steps per process, after a warm-up")
    parser.add_argument("--executor", choices=EXECUTORS, default="one-stream")
    parser.add_argument("--batch", type=int, default=8, help="batch of the NMT steps")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.steps_of.split(",") if name.strip()]
    if not names or not set(names) <= set(STEPS):
        parser.error(f"--steps-of must name some of {list(STEPS)}, got {args.steps_of!r}")
    if min(args.runs, args.steps, args.batch) < 1:
        parser.error("--runs, --steps and --batch must be positive")
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.nmt import loop_peaks

    print(f"{args.executor}, {_DEVICE_MB} MB emulated device, {args.steps} steps per process after a warm-up, "
          f"NMT batch {args.batch}")
    print("| step | loops | run | lowest MB | median MB | highest MB | predicted MB | median step ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for loops in LOOP_SETTINGS:
            for run in range(1, args.runs + 1):
                result = run_with_budget(loop_peaks.peaks, name, loops, args.steps, args.batch, budget_mb=_DEVICE_MB,
                                         one_stream=args.executor == "one-stream")
                print(format_row(name, loops, run, result.value) if result.ok else
                      f"| {name} | {loops} | {run} | {result.verdict}: {result.message.strip()[-200:]} |||||", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
