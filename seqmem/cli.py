"""The `seqmem` command line: `seqmem demo` and `seqmem accuracy`."""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main", "train_example"]

_MB = 1 << 20


def _demo(args: argparse.Namespace) -> int:
    from seqmem.accuracy import measure_accuracy, format_table
    from seqmem.device import run_with_budget

    os.makedirs(args.out, exist_ok=True)
    plot_path = os.path.join(args.out, f"memory-{args.example}.png")
    print(f"profiling the built-in '{args.example}' step (batch {args.batch}) on an emulated "
          f"{args.budget_mb} MB device ...", flush=True)
    run = run_with_budget(_profile_and_plot, args.example, args.batch, plot_path, budget_mb=args.budget_mb)
    if not run.ok:
        print(f"profiling failed ({run.verdict}): {run.message}", file=sys.stderr)
        return 1
    print(run.value)
    print(f"wrote {plot_path}\n")
    print("simulator accuracy, each example in a fresh emulated-device process:", flush=True)
    started = time.time()
    print(format_table(measure_accuracy()))
    print(f"({time.time() - started:.0f} s)\n")
    return _optimize_demo(args.optimize_example, args.optimize_batch, args.optimize_budget_mb)


def _optimize_demo(example: str, batch: int, budget_mb: int) -> int:
    from seqmem.device import run_with_budget

    print(f"seqmem.optimize: the '{example}' step at batch {batch} on an emulated {budget_mb} MB device", flush=True)
    baseline = run_with_budget(train_example, example, batch, budget_mb, False, budget_mb=budget_mb)
    print(f"  without seqmem: {baseline.verdict}"
          + (f", measured peak {baseline.value[0] / _MB:.1f} MB" if baseline.ok else ""))
    optimized = run_with_budget(train_example, example, batch, budget_mb, True, budget_mb=budget_mb)
    if not optimized.ok:
        print(f"  with seqmem: {optimized.verdict}: {optimized.message}", file=sys.stderr)
        return 1
    peak, plan_summary = optimized.value
    print(f"  with seqmem: trains, measured peak {peak / _MB:.1f} MB (two steps)")
    print("  " + plan_summary.replace("\n", "\n  "))
    return 0


def train_example(example: str, batch: int, budget_mb: int, optimized: bool, safety_margin: float = 0.3):
    """Child process: two training steps of a built-in example, optionally optimized for `budget_mb`.

    Returns (measured peak bytes, the plan's summary or "").
    """
    from seqmem import device
    from seqmem.examples import build_example
    from seqmem.optimizer import optimize

    built = build_example(example, batch)
    step = built.step
    if optimized:
        step = optimize(built.step, budget_mb, input_signature=built.input_specs, safety_margin=safety_margin)
    inputs = built.make_inputs(0)
    for _ in range(2):
        step(*inputs).numpy()
    return device.memory_stats().peak_bytes, step.plan.summary() if optimized else ""


def _profile_and_plot(example: str, batch: int, plot_path: str) -> str:
    from seqmem.examples import build_example
    from seqmem.profiling import profile

    step = build_example(example, batch)
    result = profile(step.step, *step.make_inputs(0))
    result.plot(plot_path, title=f"{example}, batch {batch}: predicted live memory over one step")
    return result.summary()


def _accuracy(args: argparse.Namespace) -> int:
    from seqmem.accuracy import DEFAULT_CASES, format_table, measure_accuracy

    cases = args.case or DEFAULT_CASES
    print(format_table(measure_accuracy(cases, budget_mb=args.budget_mb)))
    return 0


def _parse_case(text: str) -> tuple[str, int]:
    from seqmem.examples import EXAMPLES

    name, _, batch = text.partition(":")
    if name not in EXAMPLES or not batch.isdigit() or int(batch) < 1:
        raise argparse.ArgumentTypeError(f"expected EXAMPLE:BATCH with EXAMPLE in {sorted(EXAMPLES)}, got {text!r}")
    return name, int(batch)


def main(argv: list[str] | None = None) -> int:
    from seqmem.examples import EXAMPLES

    parser = argparse.ArgumentParser(prog="seqmem", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="profile a built-in step, plot its memory curve, print simulator accuracy")
    demo.add_argument("--example", choices=sorted(EXAMPLES), default="cnn")
    demo.add_argument("--batch", type=int, default=64)
    demo.add_argument("--budget-mb", type=int, default=4096, help="emulated device memory (MiB)")
    demo.add_argument("--out", default="demo-output", help="folder for the plot")
    demo.add_argument("--optimize-example", choices=sorted(EXAMPLES), default="resnet")
    demo.add_argument("--optimize-batch", type=int, default=256)
    demo.add_argument("--optimize-budget-mb", type=int, default=200, help="emulated device for the optimize demo")
    demo.set_defaults(run=_demo)
    accuracy = commands.add_parser("accuracy", help="predicted vs measured peak on the emulated device")
    accuracy.add_argument("--case", action="append", type=_parse_case,
                          help="EXAMPLE:BATCH (repeatable); default: one batch per example")
    accuracy.add_argument("--budget-mb", type=int, default=4096)
    accuracy.set_defaults(run=_accuracy)
    args = parser.parse_args(argv)
    sizes = [getattr(args, name, 1) for name in ("batch", "budget_mb", "optimize_batch", "optimize_budget_mb")]
    if min(sizes) < 1:
        parser.error("batch sizes and budgets must be positive")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
