"""The `seqmem` command line: `seqmem demo` and `seqmem accuracy`."""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main"]


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
    print(f"({time.time() - started:.0f} s)")
    return 0


def _profile_and_plot(example: str, batch: int, plot_path: str) -> str:
    from seqmem.examples import build_example
    from seqmem.profile import profile

    step = build_example(example, batch)
    result = profile(step.step, *step.make_inputs(0))
    result.plot(plot_path, title=f"{example}, batch {batch}: predicted live memory over one step")
    return result.summary()


def _accuracy(args: argparse.Namespace) -> int:
    from seqmem.accuracy import DEFAULT_CASES, format_table, measure_accuracy

    cases = DEFAULT_CASES if not args.case else [_parse_case(c) for c in args.case]
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
    demo.set_defaults(run=_demo)
    accuracy = commands.add_parser("accuracy", help="predicted vs measured peak on the emulated device")
    accuracy.add_argument("--case", action="append", help="EXAMPLE:BATCH (repeatable); default: the README's table")
    accuracy.add_argument("--budget-mb", type=int, default=4096)
    accuracy.set_defaults(run=_accuracy)
    args = parser.parse_args(argv)
    if getattr(args, "batch", 1) < 1 or args.budget_mb < 1:
        parser.error("--batch and --budget-mb must be positive")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
