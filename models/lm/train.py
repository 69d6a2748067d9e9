"""Train the LSTM language model with and without seqmem: do the perplexity curves match?

Each variant (as `models.lm.benchmark` names them: base, swap, efficient, ...)
trains the same model from the same seeded weights on the same words of a
synthetic Markov source (`models.lm.corpus`, whose own perplexity is the floor
a model can reach) or of a PTB-format folder (--data: ptb.train.txt and
ptb.valid.txt, one sentence a line; the vocabulary is the training file's
words, as TF-LM builds it), in a fresh process on an emulated device of --arena-mb
with one compute stream and TensorFlow's op determinism on. Optimized variants
are planned by `seqmem.optimize` for --budget-mb, below the base step's peak,
so that their plans swap. Every step's loss and, every --eval-every steps, the
validation perplexity are recorded, with each variant's highest step peak.

    python -m models.lm.train --out results/lm-training          # 2 layers of 256 units, 500 steps
    python -m models.lm.train --quick --out /tmp/lm              # 2 layers of 64 units, 20 steps
    python -m models.lm.train --data simple-examples/data --units 200 --out run   # PTB, TF-LM's small size

Writes lm-training.json and lm-perplexity.png under --out and prints, per
variant, the final perplexity, the peak and how far its losses are from base's
(0: bit for bit).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from tqdm import tqdm

from seqmem.bench.report import value_or_verdict
from seqmem.files import save_figure, write_json
from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

from models.lm.benchmark import VARIANTS
from models.lm.corpus import MarkovSource, read_ptb, window_count, windows
from models.lm.model import OPTIMIZERS


def train_variant(variant: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Child process (emulated device): train `variant` for settings["steps"] steps. Returns its losses
    (nats, one per step), validation perplexities at settings["eval_every"] steps, the highest step peak
    (bytes), the swaps the plan made and the median step time (seconds)."""
    import numpy as np
    import tensorflow as tf

    from models.lm.model import language_model
    from seqmem.runtime.device import memory_stats, reset_peak

    tf.config.experimental.enable_op_determinism()
    cells, loss, optimized = VARIANTS[variant]
    batch, time_steps = settings["batch_size"], settings["time_steps"]
    train_words, valid_words, floor = corpus_words(settings)
    train, valid = windows(train_words, batch, time_steps), windows(valid_words, batch, time_steps)
    model = language_model(settings["layers"], settings["units"], settings["vocab"], cells, loss,
                           settings["optimizer"], settings["learning_rate"], seed=settings["seed"])
    step, swaps = model.train_step(), 0
    if optimized:
        from seqmem.runtime.optimize import optimize

        specs = [tf.TensorSpec([batch, time_steps], tf.int32)] * 2
        step = optimize(step, settings["budget_mb"], input_signature=specs, sample_inputs=_split(train[0]))
        swaps = len(step.plan.decisions) + len(step.plan.loop_swaps)
    evaluate = tf.function(lambda inputs, targets: tf.reduce_mean(model.token_losses(inputs, targets, False)),
                           autograph=False)
    losses, perplexities, peaks, seconds = [], [], [], []
    for index in range(settings["steps"]):
        inputs, targets = _split(train[index % len(train)])
        reset_peak()
        started = time.perf_counter()
        losses.append(float(step(inputs, targets)))
        seconds.append(time.perf_counter() - started)
        peaks.append(memory_stats().peak_bytes)
        if (index + 1) % settings["eval_every"] == 0 or index + 1 == settings["steps"]:
            mean = np.mean([float(evaluate(*_split(window))) for window in valid])
            perplexities.append({"step": index + 1, "perplexity": math.exp(mean)})
    return {"losses": losses, "perplexities": perplexities, "peak_bytes": max(peaks), "swaps": swaps,
            "median_step_s": sorted(seconds)[len(seconds) // 2],
            "source_perplexity": None if floor is None else floor(valid[:, :, :-1], valid[:, :, 1:])}


def corpus_words(settings: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(training words, validation words, the source's perplexity function or None): PTB-format text from
    settings["data"] (`models.lm.corpus.read_ptb`), or else the synthetic source of settings["vocab"] words."""
    if settings["data"] is not None:
        corpus = read_ptb(settings["data"])
        return corpus.train, corpus.valid, None
    source = MarkovSource(settings["vocab"], seed=settings["seed"])
    return (source.sample(settings["train_words"], seed=1), source.sample(settings["valid_words"], seed=2),
            source.perplexity)


def _split(window) -> tuple[Any, Any]:
    """A [batch, time_steps + 1] window of words as (inputs, targets) tensors, the targets one word later."""
    from seqmem.runtime.device import on_device

    return on_device(window[:, :-1]), on_device(window[:, 1:])


def loss_distance(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference between two runs' losses, step by step (0.0: equal bit for bit)."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for lm-training.json and lm-perplexity.png")
    parser.add_argument("--quick", action="store_true", help="2 layers of 64 units, vocabulary 100, 20 steps, 5 MB")
    parser.add_argument("--variants", default="base,efficient,swap", help=f"comma-separated, base first; of {list(VARIANTS)}")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--data", help="a PTB-format folder (ptb.train.txt, ptb.valid.txt) instead of the "
                                       "synthetic source")
    parser.add_argument("--vocab", type=int, help="the synthetic source's words (default 1000; with --data, "
                                                  "the training file's)")
    parser.add_argument("--time-steps", type=int, default=35)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=25, help="steps between validation perplexities")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="sgd: TF-LM's (try rate 1.0)")
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--train-words", type=int, default=400_000, help="the synthetic source's")
    parser.add_argument("--valid-words", type=int, default=40_000, help="the synthetic source's")
    parser.add_argument("--budget-mb", type=int, default=48, help="the budget optimized variants plan for")
    parser.add_argument("--arena-mb", type=int, default=256, help="the emulated device every variant trains on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=int, default=3600, help="limit for one variant's process")
    args = parser.parse_args(argv)
    if args.data is not None and args.vocab is not None:
        parser.error("--vocab sets the synthetic source's words; with --data the vocabulary is the training file's")
    if args.quick:
        args.layers, args.units, args.time_steps, args.batch_size = 2, 64, 20, 32
        args.vocab = 100 if args.data is None else None
        args.steps, args.eval_every, args.train_words, args.valid_words = 20, 10, 20_000, 4_000
        args.budget_mb, args.arena_mb = 5, 128
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or variants[0] != "base" or not set(variants) <= set(VARIANTS) or len(set(variants)) < len(variants):
        parser.error(f"--variants must start with base and name each of {list(VARIANTS)} at most once, "
                     f"got {args.variants!r}")
    for name in ("layers", "units", "time_steps", "batch_size", "steps", "eval_every", "train_words", "valid_words",
                 "budget_mb", "arena_mb", "timeout_s"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.learning_rate <= 0:
        parser.error(f"--learning-rate must be positive, got {args.learning_rate}")
    words = {"--train-words": args.train_words, "--valid-words": args.valid_words}
    if args.data is None:
        args.vocab = 1000 if args.vocab is None else args.vocab
        if args.vocab < 2:
            parser.error(f"--vocab must be at least 2, got {args.vocab}")
    else:
        try:
            corpus = read_ptb(args.data)
        except (OSError, ValueError) as error:
            parser.error(f"--data: {error}")
        args.vocab = len(corpus.vocabulary)
        words = {"ptb.train.txt": len(corpus.train), "ptb.valid.txt": len(corpus.valid)}
    for name, count in words.items():
        if window_count(count, args.batch_size, args.time_steps) < 1:
            parser.error(f"{name} ({count} words) must hold one window of --batch-size {args.batch_size} rows "
                         f"of --time-steps + 1 = {args.time_steps + 1} words")
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.lm import train as this

    settings = {key: value for key, value in vars(args).items() if key not in ("out", "quick", "variants")}
    report: dict[str, Any] = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "runs": {}}
    os.makedirs(args.out, exist_ok=True)
    for variant in tqdm(variants, desc="variants", unit="run", file=sys.stderr):
        run = run_with_budget(this.train_variant, variant, settings, budget_mb=args.arena_mb,
                              timeout_s=args.timeout_s)
        report["runs"][variant] = value_or_verdict(run)
        write_json(report, os.path.join(args.out, "lm-training.json"))  # each run as soon as it ends
    print(format_report(report))
    chart = perplexity_chart(os.path.join(args.out, "lm-perplexity.png"), report)
    print(f"wrote {os.path.join(args.out, 'lm-training.json')} and {chart}")
    return 0 if all("losses" in run for run in report["runs"].values()) else 1


def format_report(report: dict[str, Any]) -> str:
    """The runs side by side in Markdown: final perplexity, peak, swaps, step time, distance to base."""
    args, runs = report["args"], report["runs"]
    base = runs.get("base", {}).get("losses")
    text = "a synthetic Markov source" if args.get("data") is None else args["data"]
    lines = [f"LSTM LM on {text}, {args['layers']} x {args['units']} units, vocabulary {args['vocab']}, {args['time_steps']} "
             f"steps, batch {args['batch_size']}, {args['steps']} {args['optimizer']} steps, emulated device {args['arena_mb']} MB "
             f"(optimized variants planned for {args['budget_mb']} MB), one stream, op determinism",
             "| variant | final validation perplexity | peak MB | swaps | median step s | largest relative loss "
             "difference to base |", "|---|---:|---:|---:|---:|---|"]
    for variant, run in runs.items():
        if "losses" not in run:
            lines.append(f"| {variant} | {run['error']} | - | - | - | - |")
            continue
        distance = "-" if base is None else _distance_text(loss_distance(run["losses"], base))
        lines.append(f"| {variant} | {run['perplexities'][-1]['perplexity']:.3f} | {run['peak_bytes'] / MIB:.1f} | "
                     f"{run['swaps']} | {run['median_step_s']:.3f} | {distance} |")
    floors = {run["source_perplexity"] for run in runs.values() if run.get("source_perplexity") is not None}
    lines += [f"The source's own perplexity on the validation words: {floor:.3f}" for floor in sorted(floors)]
    return "\n".join(lines)


def _distance_text(distance: float) -> str:
    return "0 (bit for bit)" if distance == 0.0 else f"{distance:.1e}"


def perplexity_chart(path: str, report: dict[str, Any]) -> str:
    """PNG of each run's validation perplexity against its steps (log scale), with the source's own
    perplexity as the floor. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    runs = [(variant, run) for variant, run in report["runs"].items() if "perplexities" in run]
    for index, (variant, run) in enumerate(runs):
        axes.plot([p["step"] for p in run["perplexities"]], [p["perplexity"] for p in run["perplexities"]],
                  styles[index % len(styles)], marker="o", markersize=3, label=variant)
    if runs and runs[0][1]["source_perplexity"] is not None:
        axes.axhline(runs[0][1]["source_perplexity"], color="grey", linewidth=0.8, label="the source's own")
    axes.set_yscale("log")
    axes.set_xlabel("training step")
    axes.set_ylabel("validation perplexity")
    text = "a synthetic Markov source" if report["args"].get("data") is None else report["args"]["data"]
    axes.set_title(f"LSTM LM on {text} (emulated device, measured)")
    axes.legend()
    figure.tight_layout()
    return save_figure(figure, path)


if __name__ == "__main__":
    sys.exit(main())
