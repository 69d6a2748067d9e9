"""seqmem: fit a TensorFlow training step into a device-memory budget.

Every command measures on an emulated device (the CPU with a bounded memory
arena, see `seqmem.device`) in a fresh process per budget; MODEL is a saved,
compiled Keras model (`model.save("m.keras")` after `model.compile(...)`) or a
built-in example, `example:mlp`, `example:cnn`, `example:resnet`, `example:lstm`.

  seqmem profile MODEL --batch 64                     predicted vs measured peak, memory curve (--png),
                                                      what is live at each peak (--at-peak N)
  seqmem plan MODEL --batch 256 --budget-mb 200       the plan that fits the budget (--json, --png; --kinds,
                                                      --compression), and with --largest-batch B_base vs B_opt
  seqmem accuracy                                     the simulator's accuracy on the built-in examples
  seqmem demo                                         a tour of the above in a few minutes
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Optional

from seqmem.examples import EXAMPLE_NAMES
from seqmem.decisions.plan import DEFAULT_SAFETY_MARGIN, KINDS, ConservationOptions
from seqmem.units import MIB

__all__ = ["accuracy_command", "demo_command", "largest_batches_command", "main", "plan_command", "profile_command",
           "train_without_seqmem_command"]

_EXAMPLE_PREFIX = "example:"
DEFAULT_DEVICE_MB = 4096  # the emulated device `profile` and `accuracy` measure on (MiB)
DEFAULT_MAX_BATCH = 4096  # upper limit of a largest-batch search
DEFAULT_PRECISION = 0.1  # a largest-batch search stops once the largest batch is known within this fraction
# The demo: a ResNet-14 step that runs out of memory under the budget without seqmem and trains with it.
DEMO_PROFILE_BATCH = 64
DEMO_BATCH = 256
DEMO_BUDGET_MB = 200
DEMO_MAX_BATCH = 2048
DEMO_SAFETY_MARGIN = 0.3


def _model_source(text: str) -> str:
    if text.startswith(_EXAMPLE_PREFIX):
        if text[len(_EXAMPLE_PREFIX):] not in EXAMPLE_NAMES:
            raise argparse.ArgumentTypeError(f"unknown example {text!r}; choose one of "
                                             + ", ".join(_EXAMPLE_PREFIX + n for n in EXAMPLE_NAMES))
        return text
    if not text.endswith(".keras"):
        raise argparse.ArgumentTypeError(f"MODEL must be a saved .keras file or example:NAME, got {text!r}")
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return os.path.abspath(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _host_memory_mb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB or 'inf', got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text!r}")
    return value


def _parse_case(text: str) -> tuple[str, int]:
    name, _, batch = text.partition(":")
    if name not in EXAMPLE_NAMES or not batch.isdigit() or int(batch) < 1:
        raise argparse.ArgumentTypeError(f"expected EXAMPLE:BATCH with EXAMPLE in {list(EXAMPLE_NAMES)}, got {text!r}")
    return name, int(batch)


class _Stage:
    """Prints what runs and, when it ends, how long it took (stages run in child processes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __enter__(self) -> "_Stage":
        print(f"{self.text} ...", flush=True)
        self.started = time.time()
        return self

    def __exit__(self, *exc) -> None:
        print(f"  ({time.time() - self.started:.0f} s)", flush=True)


def _fail(run, what: str) -> int:
    last_line = (run.message.strip().splitlines() or [""])[-1]
    print(f"error: {what} failed ({run.verdict}): {last_line}", file=sys.stderr)
    return 1


def profile_command(model: str, batch: int, *, device_mb: int = DEFAULT_DEVICE_MB, png: Optional[str] = None,
                    at_peak: int = 0) -> int:
    """`seqmem profile`: print the predicted and measured peak of `model`'s step at `batch` on an emulated
    `device_mb` MiB device (and the `at_peak` largest buffers live at each peak); the curve to `png`."""
    from seqmem import cli_jobs
    from seqmem.runtime.device import run_with_budget

    with _Stage(f"profiling {model} at batch {batch} on an emulated {device_mb} MB device"):
        run = run_with_budget(cli_jobs.profile_step, model, batch, png, at_peak, budget_mb=device_mb)
    if not run.ok:
        return _fail(run, "profiling")
    print(run.value)
    if png:
        print(f"wrote {png}")
    return 0


def plan_command(model: str, batch: int, budget_mb: int, *, safety_margin: float = DEFAULT_SAFETY_MARGIN,
                 options: ConservationOptions = ConservationOptions(), host_memory_mb: Optional[float] = None,
                 json_path: Optional[str] = None, png: Optional[str] = None) -> int:
    """`seqmem plan`: optimize `model`'s step at `batch` for `budget_mb` MiB in a fresh emulated device of that
    size, train two steps with it, print the plan and the measured peak; the plan to `json_path`, its curves
    to `png`."""
    from seqmem import cli_jobs
    from seqmem.runtime.device import run_with_budget

    with _Stage(f"planning {model} at batch {batch} for an emulated {budget_mb} MB device"):
        run = run_with_budget(cli_jobs.plan_step, model, batch, budget_mb, json_path, png, safety_margin, options,
                              host_memory_mb, budget_mb=budget_mb)
    if not run.ok:
        return _fail(run, "planning")
    trained_peak, summary = run.value
    print(summary)
    print(f"trained two steps with the plan: measured peak {trained_peak / MIB:.1f} MB")
    for path in (json_path, png):
        if path:
            print(f"wrote {path}")
    return 0


def largest_batches_command(model: str, budget_mb: int, *, start: int = 1, max_batch: int = DEFAULT_MAX_BATCH,
                            safety_margin: float = DEFAULT_SAFETY_MARGIN,
                            options: ConservationOptions = ConservationOptions(),
                            host_memory_mb: Optional[float] = None, precision: float = DEFAULT_PRECISION,
                            known: Optional[Mapping[str, Mapping[int, bool]]] = None) -> int:
    """`seqmem plan --largest-batch`: print the largest batch (<= `max_batch`, within `precision`, relative)
    that trains two steps of `model` under `budget_mb` MiB without and with seqmem (real OOMs, a fresh
    process per probe). known: batches already tried, whether each trained, by "without seqmem" and
    "with seqmem"; not probed again."""
    from tqdm import tqdm

    from seqmem import cli_jobs
    from seqmem.bench.batch_search import largest_batch
    from seqmem.bench.workload import Workload, trains

    found = {}
    for label, optimized in (("without seqmem", False), ("with seqmem", True)):
        workload = Workload(cli_jobs.model_step, (("source", model),), optimized, budget_mb, safety_margin,
                            kinds=options.kinds, compression=options.compression, host_memory_mb=host_memory_mb)
        with tqdm(desc=f"largest batch {label}", unit="probe", file=sys.stdout) as progress:
            search = largest_batch(trains, workload, budget_mb=budget_mb, limit=max_batch,
                                   start=min(max(found.get("without seqmem", start), 1), max_batch), precision=precision,
                                   known=(known or {}).get(label),
                                   on_probe=lambda batch, verdict: progress.set_postfix_str(f"{batch}: {verdict}")
                                   or progress.update(1))
        found[label] = search.batch
        for note in search.notes:
            print(f"  note: {note}")
    base, opt = found["without seqmem"], found["with seqmem"]
    ratio = f" ({opt / base:.2f}x)" if base else ""
    print(f"largest batch under {budget_mb} MB (within {precision:.0%}): without seqmem {base}, with seqmem {opt}{ratio}")
    return 0


def accuracy_command(cases: Optional[Sequence[tuple[str, int]]] = None, *, device_mb: int = DEFAULT_DEVICE_MB,
                     one_stream: bool = True, reserved_arena: bool = False) -> int:
    """`seqmem accuracy`: print predicted vs measured peaks of the built-in `cases` ((example, batch) pairs;
    default `examples.accuracy.DEFAULT_CASES`), each in a fresh emulated `device_mb` MiB device."""
    from seqmem.examples.accuracy import DEFAULT_CASES, format_table, measure_accuracy

    cases = cases or DEFAULT_CASES
    with _Stage(f"profiling {len(cases)} built-in steps, each in a fresh {device_mb} MB emulated device"):
        rows = measure_accuracy(cases, budget_mb=device_mb, one_stream=one_stream, reserved_arena=reserved_arena)
    print(format_table(rows))
    return 0


def train_without_seqmem_command(model: str, batch: int, budget_mb: int) -> Optional[bool]:
    """Train two steps of `model` at `batch` as it is on an emulated `budget_mb` MiB device; print whether it
    trains or runs out of memory. Returns whether it trained; None when it failed otherwise (said why)."""
    from seqmem import cli_jobs
    from seqmem.bench.batch_search import PROBE_STALL_S
    from seqmem.bench.workload import Workload, trains
    from seqmem.runtime.device import run_with_budget

    with _Stage(f"training {model} at batch {batch} without seqmem on an emulated {budget_mb} MB device"):
        run = run_with_budget(trains, batch, Workload(cli_jobs.model_step, (("source", model),), False, budget_mb),
                              budget_mb=budget_mb, stall_s=PROBE_STALL_S)  # the batch searches' probe, as they run it
    print(f"  without seqmem: {'trains' if run.ok else run.verdict}")
    if run.verdict not in ("ok", "oom"):
        _fail(run, "training without seqmem")
        return None
    return run.ok


def demo_command(out: str, *, batch: int = DEMO_BATCH, budget_mb: int = DEMO_BUDGET_MB,
                 max_batch: int = DEMO_MAX_BATCH, precision: float = DEFAULT_PRECISION) -> int:
    """`seqmem demo`: profile the cnn example, then train the resnet example at `batch` under `budget_mb` MiB
    without seqmem and with a plan, and find the largest batch (<= `max_batch`, within `precision`) each
    trains; files in `out`."""
    os.makedirs(out, exist_ok=True)
    print("1/3: profile a built-in step (a CNN) and measure its peak")
    if profile_command("example:cnn", DEMO_PROFILE_BATCH, png=os.path.join(out, "memory-cnn.png")):
        return 1
    print(f"\n2/3: a ResNet-14 step at batch {batch} under {budget_mb} MB, without seqmem")
    trains_without = train_without_seqmem_command("example:resnet", batch, budget_mb)
    if trains_without is None:
        return 1
    print("\n3/3: the plan that fits it, then the largest batch without and with seqmem")
    if plan_command("example:resnet", batch, budget_mb, safety_margin=DEMO_SAFETY_MARGIN,
                    json_path=os.path.join(out, "plan.json"), png=os.path.join(out, "plan-resnet.png")):
        return 1
    tried = {"without seqmem": {batch: trains_without}, "with seqmem": {batch: True}}  # the same probes, run above
    return largest_batches_command("example:resnet", budget_mb, start=batch, max_batch=max_batch,
                                   safety_margin=DEMO_SAFETY_MARGIN, precision=precision, known=tried)


def _plan(args: argparse.Namespace) -> int:
    shared = dict(safety_margin=args.safety_margin, options=args.options, host_memory_mb=args.host_memory_mb)
    if plan_command(args.model, args.batch, args.budget_mb, json_path=args.json, png=args.png, **shared):
        return 1
    if args.largest_batch:
        return largest_batches_command(args.model, args.budget_mb, start=args.batch, max_batch=args.max_batch,
                                       **shared)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqmem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    profile = commands.add_parser("profile", help="predicted and measured peak of one training step")
    profile.add_argument("model", type=_model_source, help="a saved, compiled .keras model, or example:NAME")
    profile.add_argument("--batch", type=_positive_int, required=True)
    profile.add_argument("--device-mb", type=_positive_int, default=DEFAULT_DEVICE_MB,
                         help="emulated device to measure on (MiB)")
    profile.add_argument("--png", help="write the predicted memory curve here")
    profile.add_argument("--at-peak", type=_positive_int, default=0, metavar="N",
                         help="list the N largest buffers live at the predicted peak and, from the allocator's "
                              "trace of one step, at the measured peak")
    profile.set_defaults(run=lambda args: profile_command(args.model, args.batch, device_mb=args.device_mb,
                                                          png=args.png, at_peak=args.at_peak))
    plan = commands.add_parser("plan", help="the swap plan that fits a budget, trained two steps on it")
    plan.add_argument("model", type=_model_source, help="a saved, compiled .keras model, or example:NAME")
    plan.add_argument("--batch", type=_positive_int, required=True)
    plan.add_argument("--budget-mb", type=_positive_int, required=True, help="the budget, and the emulated device (MiB)")
    plan.add_argument("--safety-margin", type=float, default=DEFAULT_SAFETY_MARGIN,
                      help="plan this fraction below the budget")
    plan.add_argument("--json", help="write the plan as JSON here")
    plan.add_argument("--png", help="write the predicted memory curves, before and after, here")
    plan.add_argument("--largest-batch", action="store_true",
                      help="also find the largest batch that trains without and with seqmem (minutes)")
    plan.add_argument("--max-batch", type=_positive_int, default=DEFAULT_MAX_BATCH, help="upper limit of --largest-batch")
    plan.add_argument("--kinds", default="swap",
                      help=f"how tensors may be conserved, comma-separated, of {', '.join(KINDS)} (default: swap)")
    plan.add_argument("--compression", help="float16 or bfloat16: the dtype of the compressing kinds")
    plan.add_argument("--host-memory-mb", type=_host_memory_mb,
                      help="the most host memory swaps may hold (MiB, or inf for no limit; "
                           "default: 3/4 of what the host has available)")
    plan.set_defaults(run=_plan)
    accuracy = commands.add_parser("accuracy", help="predicted vs measured peak of the built-in examples")
    accuracy.add_argument("--case", action="append", type=_parse_case,
                          help="EXAMPLE:BATCH (repeatable); default: one batch per example")
    accuracy.add_argument("--device-mb", type=_positive_int, default=DEFAULT_DEVICE_MB, help="emulated device (MiB)")
    accuracy.add_argument("--concurrent-ops", action="store_true",
                          help="TensorFlow's default inter-op pool instead of one op at a time (one compute stream)")
    accuracy.add_argument("--reserved-arena", action="store_true",
                          help="reserve the emulated device's arena up front, as a GPU's, instead of growing it")
    accuracy.set_defaults(run=lambda args: accuracy_command(args.case, device_mb=args.device_mb,
                                                            one_stream=not args.concurrent_ops,
                                                            reserved_arena=args.reserved_arena))
    demo = commands.add_parser("demo", help="profile, plan and batch search on built-in examples (a few minutes)")
    demo.add_argument("--out", default="demo-output", help="folder for the plot and the plan")
    demo.add_argument("--batch", type=_positive_int, default=DEMO_BATCH, help="the ResNet-14 step's batch")
    demo.add_argument("--budget-mb", type=_positive_int, default=DEMO_BUDGET_MB,
                      help="the budget, and the emulated device (MiB)")
    demo.add_argument("--max-batch", type=_positive_int, default=DEMO_MAX_BATCH,
                      help="upper limit of the largest-batch search")
    demo.add_argument("--precision", type=_fraction, default=DEFAULT_PRECISION,
                      help="stop the batch searches once the largest batch is known within this fraction")
    demo.set_defaults(run=lambda args: demo_command(args.out, batch=args.batch, budget_mb=args.budget_mb,
                                                    max_batch=args.max_batch, precision=args.precision))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 <= getattr(args, "safety_margin", 0.0) < 1:
        parser.error(f"--safety-margin must be in [0, 1), got {args.safety_margin}")
    if args.command == "plan":
        try:
            args.options = ConservationOptions(tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
                                               args.compression)
        except ValueError as error:
            parser.error(f"--kinds/--compression: {error}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no TensorFlow start-up chatter in the child processes
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
