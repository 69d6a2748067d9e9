"""LSTM language-model batch size under a memory budget: the paper's Table 2(a), measured.

A word-level language model after TF-LM (embedding, --layers stacked LSTM layers
of --units, a softmax over --vocab words, --time-steps tokens, gradients clipped
to global norm 5, SGD). For each layer count, on the emulated device (every probe
a fresh process, real OOM), the largest batch that trains two full steps under
--budget-mb for:

    base        tf.keras.layers.LSTM                                   (B_base)
    swap        base, and seqmem.optimize (the loops' accumulators swapped, then
                feature maps)
    efficient   seqmem.MemoryEfficientLSTM: gates recomputed in backward
    both        efficient, and seqmem.optimize (its loops' accumulators swapped)
    loss        base with seqmem's blocked softmax cross-entropy (seqmem.layers.softmax_loss)
    swap-loss   swap and the blocked loss
    all         efficient, the blocked loss and seqmem.optimize

A probe that crashes (a kernel dying on a full arena instead of raising) counts
as not fitting and is listed in the notes. At B_base (or --at-batch, which skips
the searches), each variant's measured and predicted peak, what it conserves and
its training throughput (target tokens/s), in an arena of twice the budget
(swapping variants still plan for the budget); with --measure-runs N, in N fresh
processes per variant, the variants alternating, and the median one reported.

    python -m models.lm.benchmark --layers 1,2,4     # 650 units, 35 steps, vocabulary 10000, 1024 MB
    python -m models.lm.benchmark --quick            # 1 and 4 layers of 256 units, vocabulary 1000, 128 MB

Writes lm-benchmark.json and lm-batch.png (batch vs layers per variant) under --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from tqdm import tqdm

from seqmem.bench.batch_search import largest_batch
from seqmem.bench.report import (EXECUTORS, alternating_medians, batch_chart, measured_cell, measured_heading, ratio,
                                 search_settings, value_or_verdict)
from seqmem.bench.workload import Workload, predicted_batch, trains
from seqmem.bench.workload import measure as measure_workload
from seqmem.runtime.device import run_with_budget
from seqmem.files import write_json

# variant: (cells, loss, optimized by seqmem)
VARIANTS = {"base": ("keras", "keras", False), "swap": ("keras", "keras", True),
            "efficient": ("efficient", "keras", False), "both": ("efficient", "keras", True),
            "loss": ("keras", "efficient", False), "swap-loss": ("keras", "efficient", True),
            "all": ("efficient", "efficient", True)}
COLUMNS = {"base": "B_base (Keras LSTM)", "swap": "swap", "efficient": "MemoryEfficientLSTM", "both": "both",
           "loss": "blocked loss", "swap-loss": "swap + blocked loss", "all": "all"}


def training_step(batch: int, layers: int, units: int, time_steps: int, vocab: int, cells: str = "keras",
                  loss: str = "keras"):
    """(training step, inputs, input specs) of the language model (`models.lm.model`) on one batch of
    seeded random words; `cells` and `loss` as `language_model` takes them."""
    import tensorflow as tf

    from models.lm.model import language_model

    step = language_model(layers, units, vocab, cells, loss).train_step()
    words = tf.random.stateless_uniform([batch, time_steps + 1], seed=[0, 1], maxval=vocab, dtype=tf.int32)
    inputs, targets = words[:, :-1], words[:, 1:]
    return step, (inputs, targets), [tf.TensorSpec(t.shape, t.dtype) for t in (inputs, targets)]


def workload(variant: str, layers: int, units: int, time_steps: int, vocab: int, budget_mb: int) -> Workload:
    """One of VARIANTS as a benchmark workload: swapping variants are optimized for `budget_mb`."""
    cells, loss, optimized = VARIANTS[variant]
    options = (("layers", layers), ("units", units), ("time_steps", time_steps), ("vocab", vocab), ("cells", cells),
               ("loss", loss))
    return Workload(training_step, options, optimized=optimized, budget_mb=budget_mb)


def measure(variant: str, batch: int, layers: int, units: int, time_steps: int, vocab: int,
            budget_mb: int) -> dict[str, Any]:
    """Child process: `seqmem.bench.workload.measure` of a variant, with its throughput in target tokens/s."""
    measured = measure_workload(batch, workload(variant, layers, units, time_steps, vocab, budget_mb))
    return {**measured, "tokens_per_s": batch * time_steps / measured["median_step_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 and 4 layers of 256 units, vocabulary 1000, 128 MB")
    parser.add_argument("--layers", default="1,2,4", help="comma-separated layer counts")
    parser.add_argument("--units", type=int, default=650)
    parser.add_argument("--time-steps", type=int, default=35)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=8192)
    parser.add_argument("--precision", type=float, default=0.1,
                        help="stop the batch search once the answer is known within this fraction (0: exact)")
    parser.add_argument("--runs", type=int, default=1, help="fresh processes a batch must train in to count as fitting")
    parser.add_argument("--timeout-s", type=int, default=1800, help="limit for one probe process")
    parser.add_argument("--executor", choices=EXECUTORS, default="one-stream")
    parser.add_argument("--at-batch", type=int,
                        help="skip the batch searches: measure every variant at this batch instead of at B_base")
    parser.add_argument("--measure-runs", type=int, default=1,
                        help="fresh processes per variant for the peak and throughput at B_base (or --at-batch)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, base among them")
    parser.add_argument("--out", default="lm-benchmark", help="folder for the JSON report")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.units, args.vocab, args.budget_mb = "1,4", 256, 1000, 128
        args.precision, args.max_batch = max(args.precision, 0.2), min(args.max_batch, 1024)
    named = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "base" not in named or not set(named) <= set(VARIANTS):
        parser.error(f"--variants must name base and any of {list(VARIANTS)}, got {args.variants!r}")
    variants = [v for v in VARIANTS if v in named]  # base first
    try:
        layer_counts = [int(n) for n in args.layers.split(",")]
    except ValueError:
        parser.error(f"--layers must be comma-separated integers, got {args.layers!r}")
    if min([args.units, args.time_steps, args.vocab, args.budget_mb, args.max_batch, args.runs, args.timeout_s,
            args.measure_runs, 1 if args.at_batch is None else args.at_batch] + layer_counts) < 1:
        parser.error("layers, units, time steps, vocabulary, budget, batch limit, runs, timeout, --measure-runs and "
                     "--at-batch must be positive")
    if not 0 <= args.precision < 1:
        parser.error(f"--precision must be in [0, 1), got {args.precision}")
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.lm import benchmark as bench

    os.makedirs(args.out, exist_ok=True)
    report: dict[str, Any] = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "rows": []}
    one_stream = args.executor == "one-stream"
    with tqdm(desc="probe processes", unit="run", file=sys.stderr) as progress:
        for layers in layer_counts:
            row: dict[str, Any] = {"layers": layers, "batch": {}, "notes": {}, "at_base": {}}
            model = (layers, args.units, args.time_steps, args.vocab, args.budget_mb)
            if args.at_batch is None:
                search_batches(row, model, variants, args, progress)
            row["measured_at"] = args.at_batch if args.at_batch is not None else row["batch"]["base"]

            def measure_variant(variant):
                progress.update(1)
                return value_or_verdict(run_with_budget(
                    bench.measure, variant, row["measured_at"], *model, budget_mb=2 * args.budget_mb,
                    timeout_s=args.timeout_s, one_stream=one_stream))

            if row["measured_at"]:
                row["at_base"] = alternating_medians(measure_variant, variants, args.measure_runs, "tokens_per_s")
            report["rows"].append(row)
            write_json(report, os.path.join(args.out, "lm-benchmark.json"))  # each row as soon as it is measured
    print(format_report(report))
    if args.at_batch is not None:
        print(f"wrote {os.path.join(args.out, 'lm-benchmark.json')}")
        return 0
    chart = batch_chart(os.path.join(args.out, "lm-batch.png"), report["rows"], "layers", "LSTM layers",
                        f"LSTM language model under {args.budget_mb} MB (emulated device, measured)")
    print(f"wrote {os.path.join(args.out, 'lm-benchmark.json')} and {chart}")
    return 0


def search_batches(row: dict[str, Any], model: tuple, variants: list[str], args: argparse.Namespace,
                   progress: tqdm) -> None:
    """Fill `row`'s "batch" and "notes" with each variant's largest batch for `model` (`workload`'s
    arguments after the variant), B_base first: the other variants' searches start there."""
    from models.lm import benchmark as bench  # children unpickle functions by module name, not __main__

    one_stream = args.executor == "one-stream"
    guess = run_with_budget(predicted_batch, bench.workload("base", *model), args.budget_mb,
                            budget_mb=args.budget_mb, timeout_s=args.timeout_s, one_stream=one_stream)
    progress.update(1)
    start = guess.value if guess.ok else 1
    for variant in variants:
        found = largest_batch(trains, bench.workload(variant, *model), budget_mb=args.budget_mb,
                              limit=args.max_batch, start=min(max(start, 1), args.max_batch),
                              precision=args.precision, runs=args.runs, one_stream=one_stream,
                              timeout_s=args.timeout_s, on_probe=lambda batch, verdict: progress.update(1))
        row["batch"][variant], row["notes"][variant] = found.batch, found.notes
        start = found.batch if variant == "base" else start


def format_report(report: dict[str, Any]) -> str:
    """The benchmark's tables in Markdown, from its JSON report (no batch table for a run with --at-batch)."""
    args = report["args"]
    lines = []
    searched = [row for row in report["rows"] if row["batch"]]
    if searched:
        lines += [f"Table 2(a): largest batch that {search_settings(args)}, emulated device {args['budget_mb']} MB, "
                  f"LSTM units {args['units']}, {args['time_steps']} steps, vocabulary {args['vocab']}; "
                  f"ratio to B_base in parentheses",
                  "| layers | " + " | ".join(COLUMNS.values()) + " |", "|---:" * (len(COLUMNS) + 1) + "|"]
    for row in searched:
        batch = row["batch"]
        cells = [str(batch["base"])] + [f"{batch[v]} ({ratio(batch[v], batch['base'])})" if v in batch else "-"
                                        for v in list(VARIANTS)[1:]]
        lines.append(f"| {row['layers']} | " + " | ".join(cells) + " |")
    measured_rows = [row for row in report["rows"] if row.get("at_base")]
    if measured_rows:
        lines += [""] if lines else []
        lines += [measured_heading(args, "conserved tensors and loop lists"),
                  "| layers | batch | " + " | ".join(VARIANTS) + " |", "|---:|---:" + "|---" * len(VARIANTS) + "|"]
    for row in measured_rows:
        measured = row["at_base"]
        reference = measured["base"].get("tokens_per_s")
        cells = [measured_cell(measured.get(variant, {"error": "-"}), "tokens_per_s", "tok/s", reference)
                 for variant in VARIANTS]
        batch = row.get("measured_at", row["batch"].get("base"))  # reports before --at-batch: B_base
        lines.append(f"| {row['layers']} | {batch} | " + " | ".join(cells) + " |")
    for row in report["rows"]:
        for variant, notes in row["notes"].items():
            lines += [f"note ({row['layers']} layers, {variant}): {note}" for note in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
