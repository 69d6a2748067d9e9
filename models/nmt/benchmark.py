"""NMT batch size under a memory budget: the paper's Table 1(a) NMT row and Table 2(b), measured.

For an attention NMT training step (LSTM encoder and decoder, units 256, source
and target of T tokens) at each T, on the emulated device (every probe a fresh
process, real OOM), the largest batch that trains two full steps under
--budget-mb for seven variants:

    base        tfa's BahdanauAttention, Keras' LSTM, no seqmem        (B_base)
    swap        base + seqmem.optimize (feature maps and loop accumulators swapped)
    efficient   seqmem's MemoryEfficientBahdanauAttention
    both        efficient attention and swapping
    cells       seqmem's MemoryEfficientLSTM (encoder) and MemoryEfficientLSTMCell (decoder)
    loss        seqmem's blocked softmax cross-entropy (seqmem.layers.softmax_loss)
    all         efficient attention, efficient cells, the blocked loss and swapping

and, at B_base for every variant (in an arena of twice the budget, so a step over
the budget is still measured): the measured peak beside seqmem's predicted one,
and training throughput in target tokens per second, in --measure-runs fresh
processes per variant (variants alternating; the run of median throughput
reported, with every run's).

    python -m models.nmt.benchmark              # T = 50, 100, 200, 400; 1024 MB
    python -m models.nmt.benchmark --quick      # T = 30, a small model, batches within 50%: a few minutes
    python -m models.nmt.benchmark --time-steps 50 --at-batch 223 --measure-runs 3
                                                # no searches: peak and throughput at batch 223

Writes nmt-benchmark.json and nmt-batch.png (batch vs T per variant) under --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tqdm import tqdm

from seqmem.bench.batch_search import largest_batch
from seqmem.bench.report import (EXECUTORS, alternating_medians, batch_chart, measured_cell, measured_heading, ratio,
                                 search_settings, value_or_verdict)
from seqmem.bench.workload import Workload, predicted_batch, trains
from seqmem.bench.workload import measure as measure_workload
from seqmem.files import write_json
from seqmem.runtime.device import run_with_budget

# variant: (attention, cells, loss, optimized by seqmem)
VARIANTS = {"base": ("tfa", "keras", "keras", False), "swap": ("tfa", "keras", "keras", True),
            "efficient": ("efficient", "keras", "keras", False), "both": ("efficient", "keras", "keras", True),
            "cells": ("tfa", "efficient", "keras", False), "loss": ("tfa", "keras", "efficient", False),
            "all": ("efficient", "efficient", "efficient", True)}
COLUMNS = {"base": "B_base (tfa)", "swap": "swap", "efficient": "efficient attention", "both": "both",
           "cells": "efficient cells", "loss": "blocked loss", "all": "all"}


def training_step(batch: int, time_steps: int, units: int, vocab: int, attention: str = "tfa", cells: str = "keras",
                  loss: str = "keras"):
    """(training step, inputs, input specs) of the NMT model with `attention` ("tfa" or "efficient"),
    `cells` ("keras" or "efficient") and `loss` ("keras" or "efficient")."""
    import tensorflow as tf

    from models.nmt.model import NMTConfig, NMTModel, make_train_step
    from seqmem.runtime.device import on_device

    tf.keras.utils.set_random_seed(0)
    model = NMTModel(NMTConfig(source_vocab=vocab, target_vocab=vocab, units=units, attention=attention,
                                 cells=cells, loss=loss))
    rng = np.random.default_rng(0)
    tokens = lambda: on_device(rng.integers(1, vocab, (batch, time_steps)).astype(np.int32))  # noqa: E731
    lengths = tf.fill([batch], time_steps)
    inputs = (tokens(), lengths, tokens(), tokens(), lengths)
    return make_train_step(model), inputs, [tf.TensorSpec(t.shape, t.dtype) for t in inputs]


def workload(variant: str, time_steps: int, units: int, vocab: int, budget_mb: int) -> Workload:
    """One of VARIANTS as a benchmark workload: swapping variants are optimized for `budget_mb`."""
    attention, cells, loss, swapping = VARIANTS[variant]
    options = (("time_steps", time_steps), ("units", units), ("vocab", vocab), ("attention", attention),
               ("cells", cells), ("loss", loss))
    return Workload(training_step, options, optimized=swapping, budget_mb=budget_mb)


def measure(variant: str, batch: int, time_steps: int, units: int, vocab: int, budget_mb: int) -> dict[str, Any]:
    """Child process: `seqmem.bench.workload.measure` of a variant, with its throughput in target tokens/s."""
    measured = measure_workload(batch, workload(variant, time_steps, units, vocab, budget_mb))
    return {**measured, "tokens_per_s": batch * time_steps / measured["median_step_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T = 30 only, units 64, vocabulary 200, 128 MB, batches within 50%%")
    parser.add_argument("--time-steps", default="50,100,200,400", help="comma-separated sequence lengths")
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--max-batch", type=int, default=2048)
    parser.add_argument("--precision", type=float, default=0.05,
                        help="stop the batch search once the answer is known within this fraction (0: exact)")
    parser.add_argument("--timeout-s", type=int, default=1800, help="limit for one probe process")
    parser.add_argument("--executor", choices=EXECUTORS, default="pool",
                        help="the emulated device's executor (default pool: on one stream the decoder's gradient loop "
                             "runs up to 32 iterations ahead in an order, and so with a peak, that varies far more)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes a batch must train in to count as fitting")
    parser.add_argument("--jobs", type=int, default=1,
                        help="probe processes side by side in batch searches (more than 1 changes the order ops run in)")
    parser.add_argument("--at-batch", type=int,
                        help="skip the batch searches: measure every variant at this batch instead of at B_base")
    parser.add_argument("--measure-runs", type=int, default=1,
                        help="fresh processes per variant for the peak and throughput at B_base (or --at-batch)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated variants to run, base among them (default: all seven)")
    parser.add_argument("--out", default="nmt-benchmark", help="folder for the JSON and the PNG")
    args = parser.parse_args(argv)
    named = {v.strip() for v in args.variants.split(",") if v.strip()}
    variants = [v for v in VARIANTS if v in named]
    if "base" not in named or not named <= set(VARIANTS):
        parser.error(f"--variants must name base and any of {list(VARIANTS)}, got {args.variants!r}")
    if args.quick:
        args.time_steps, args.units, args.vocab, args.budget_mb = "30", 64, 200, 128
        args.max_batch = min(args.max_batch, 512)
        args.precision, args.timeout_s = max(args.precision, 0.5), min(args.timeout_s, 300)
    try:
        time_steps = [int(t) for t in args.time_steps.split(",")]
    except ValueError:
        parser.error(f"--time-steps must be comma-separated integers, got {args.time_steps!r}")
    if min([args.budget_mb, args.units, args.vocab, args.max_batch, args.timeout_s, args.jobs, args.runs,
            args.measure_runs, 1 if args.at_batch is None else args.at_batch] + time_steps) < 1:
        parser.error("time steps, budget, units, vocabulary, batch limit, timeout, jobs, runs and --at-batch "
                     "must be positive")
    if not 0 <= args.precision < 1:
        parser.error(f"--precision must be in [0, 1), got {args.precision}")
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.nmt import benchmark as bench

    os.makedirs(args.out, exist_ok=True)
    report: dict[str, Any] = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "rows": []}
    model = (args.units, args.vocab)
    one_stream = args.executor == "one-stream"
    with tqdm(desc="probe processes", unit="run", file=sys.stderr) as progress:
        for steps in time_steps:
            row: dict[str, Any] = {"time_steps": steps, "batch": {}, "notes": {}, "at_base": {}}
            if args.at_batch is None:
                search_batches(row, steps, variants, args, progress)
            row["measured_at"] = args.at_batch if args.at_batch is not None else row["batch"]["base"]

            def measure_variant(variant):
                progress.update(1)
                return value_or_verdict(run_with_budget(
                    bench.measure, variant, row["measured_at"], steps, *model, args.budget_mb,
                    budget_mb=2 * args.budget_mb, timeout_s=args.timeout_s, one_stream=one_stream))

            if row["measured_at"]:
                row["at_base"] = alternating_medians(measure_variant, variants, args.measure_runs, "tokens_per_s")
            report["rows"].append(row)
            write_json(report, os.path.join(args.out, "nmt-benchmark.json"))  # each row as soon as it is measured

    print(format_report(report))
    if args.at_batch is not None:
        print(f"wrote {write_json(report, os.path.join(args.out, 'nmt-benchmark.json'))}")
        return 0
    chart = batch_chart(os.path.join(args.out, "nmt-batch.png"), report["rows"], "time_steps",
                        "time steps T (source and target)", f"NMT under {args.budget_mb} MB (emulated device, measured)")
    path = write_json(report, os.path.join(args.out, "nmt-benchmark.json"))
    print(f"wrote {path} and {chart}")
    return 0


def search_batches(row: dict[str, Any], steps: int, variants: list[str], args: argparse.Namespace,
                   progress: tqdm) -> None:
    """Fill `row`'s "batch" and "notes" with each variant's largest batch at `steps` time steps (B_base
    first: the other variants' searches start there)."""
    from models.nmt import benchmark as bench  # children unpickle functions by module name, not __main__

    model, one_stream = (args.units, args.vocab), args.executor == "one-stream"
    guess = run_with_budget(predicted_batch, bench.workload("base", steps, *model, args.budget_mb),
                            args.budget_mb, budget_mb=args.budget_mb, timeout_s=args.timeout_s,
                            one_stream=one_stream)
    progress.update(1)

    def search(variant, start):
        return largest_batch(trains, bench.workload(variant, steps, *model, args.budget_mb),
                             budget_mb=args.budget_mb,
                             limit=args.max_batch, start=min(max(start, 1), args.max_batch),
                             precision=args.precision, runs=args.runs, one_stream=one_stream,
                             timeout_s=args.timeout_s,
                             on_probe=lambda batch, verdict: progress.update(1))

    found = {"base": search("base", guess.value if guess.ok else 1)}
    base = found["base"].batch
    # the other variants start from B_base and are independent: probe them side by side
    others = [v for v in variants if v != "base"]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        found.update(zip(others, pool.map(lambda variant: search(variant, base), others)))
    for variant in found:
        row["batch"][variant], row["notes"][variant] = found[variant].batch, found[variant].notes


def format_report(report: dict[str, Any]) -> str:
    """The benchmark's tables in Markdown, from its JSON report (no batch table for a run with --at-batch)."""
    args = report["args"]
    lines = []
    searched = [row for row in report["rows"] if row["batch"]]
    if searched:
        lines += [f"Largest batch that {search_settings(args)}, emulated device {args['budget_mb']} MB, "
                  f"units {args['units']}, vocabulary {args['vocab']}; ratio to B_base in parentheses",
                  "| T | " + " | ".join(COLUMNS.values()) + " |", "|---:" * (len(COLUMNS) + 1) + "|"]
    for row in searched:
        batch = row["batch"]
        cells = [str(batch["base"])] + [f"{batch[v]} ({ratio(batch[v], batch['base'])})" if v in batch else "-"
                                        for v in list(VARIANTS)[1:]]
        lines.append(f"| {row['time_steps']} | " + " | ".join(cells) + " |")
    lines += [""] if lines else []
    lines += [measured_heading(args, "swaps"),
              "| T | batch | " + " | ".join(VARIANTS) + " |", "|---:|---:" + "|---" * len(VARIANTS) + "|"]
    for row in report["rows"]:
        measured = row["at_base"]
        if not measured:
            continue
        reference = measured["base"].get("tokens_per_s")
        cells = [measured_cell(measured.get(variant, {"error": "-"}), "tokens_per_s", "tok/s", reference)
                 for variant in VARIANTS]
        batch = row.get("measured_at", row["batch"].get("base"))  # reports before --at-batch: B_base
        lines.append(f"| {row['time_steps']} | {batch} | " + " | ".join(cells) + " |")
    for row in report["rows"]:
        for variant, notes in row["notes"].items():
            lines += [f"note (T={row['time_steps']}, {variant}): {note}" for note in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
