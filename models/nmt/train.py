"""Train the attention NMT model or the Transformer (models.transformer), with validation BLEU (sacrebleu)
and checkpoints.

    python -m models.nmt.train --synthetic --out nmt-run --steps 600
    python -m models.nmt.train --train-prefix data/train --valid-prefix data/valid --out nmt-run
    python -m models.nmt.train --synthetic --out run --memory-budget-mb 512 --attention efficient --cells efficient --swap
    python -m models.nmt.train --synthetic --out run --architecture transformer --attention efficient \
        --memory-budget-mb 512 --swap --kinds swap,blocked-head

A corpus prefix P names the files P.src and P.tgt (one sentence per line).
--synthetic writes a corpus of the built-in language pair (models.nmt.synthetic)
under --out. --memory-budget-mb runs on the emulated device of that many MiB (a
GPU is limited to it instead when one is visible); --swap optimizes the training
step with seqmem.optimize for that budget (conserving by --kinds), once per
bucket shape. --units is the Transformer's model width (--layers encoder and as
many decoder layers, --heads heads, feed-forward 4 x units, dropout --dropout);
its attention "tfa" is Keras' MultiHeadAttention. The run's losses and BLEU
scores go to <out>/log.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--synthetic", action="store_true", help="generate the built-in language pair under --out")
    data.add_argument("--train-prefix", help="training corpus: PREFIX.src and PREFIX.tgt")
    parser.add_argument("--valid-prefix", help="validation corpus (required with --train-prefix)")
    parser.add_argument("--out", required=True, help="folder for checkpoints, vocabularies and log.json")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--architecture", choices=("lstm", "transformer"), default="lstm")
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4, help="the Transformer's attention heads")
    parser.add_argument("--dropout", type=float, default=0.1, help="the Transformer's dropout")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--bidirectional", action="store_true")
    parser.add_argument("--attention", choices=("tfa", "efficient"), default="tfa")
    parser.add_argument("--cells", choices=("keras", "efficient"), default="keras",
                        help="Keras' LSTM layers and cells, or seqmem's memory-efficient ones (same weights)")
    parser.add_argument("--loss", choices=("keras", "efficient"), default="keras",
                        help="cross-entropy over the full logits, or block by block (seqmem.layers.softmax_loss)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="cap on each vocabulary, special tokens included")
    parser.add_argument("--max-length", type=int, default=50, help="drop training pairs longer than this (tokens)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=200, help="steps between validation BLEU and checkpoints")
    parser.add_argument("--beam-width", type=int, default=1, help="1: greedy decoding for validation")
    parser.add_argument("--memory-budget-mb", type=int, help="train on a device of this many MiB")
    parser.add_argument("--swap", action="store_true", help="optimize the step with seqmem for --memory-budget-mb")
    parser.add_argument("--kinds", default="swap", help="seqmem.optimize's kinds with --swap, comma-separated")
    parser.add_argument("--synthetic-size", type=int, default=6000, help="training pairs of --synthetic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true", help="enable TensorFlow's op determinism")
    args = parser.parse_args(argv)
    if args.train_prefix and not args.valid_prefix:
        parser.error("--train-prefix needs --valid-prefix")
    if args.swap and not args.memory_budget_mb:
        parser.error("--swap optimizes for a budget: give --memory-budget-mb")
    args.kinds = tuple(kind.strip() for kind in args.kinds.split(",") if kind.strip())
    from seqmem.decisions.plan import ConservationOptions

    try:
        ConservationOptions(args.kinds)
    except ValueError as error:
        parser.error(f"--kinds: {error}")
    if args.architecture == "transformer":
        if args.cells != "keras" or args.bidirectional or args.beam_width != 1:
            parser.error("the Transformer has no --cells, --bidirectional or --beam-width (greedy decoding)")
        if args.units % args.heads:
            parser.error(f"--heads must divide --units, got {args.heads} and {args.units}")
        if not 0 <= args.dropout < 1:
            parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    for name in ("steps", "batch_size", "units", "heads", "layers", "vocab_size", "max_length", "eval_every", "beam_width",
                 "synthetic_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.memory_budget_mb is not None and args.memory_budget_mb < 1:
        parser.error(f"--memory-budget-mb must be positive, got {args.memory_budget_mb}")
    if args.learning_rate <= 0:
        parser.error(f"--learning-rate must be positive, got {args.learning_rate}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.memory_budget_mb:
        from seqmem.runtime.device import configure_emulated_device

        configure_emulated_device(args.memory_budget_mb)
    from models.nmt.training import TrainingRun, corpus_pairs
    from seqmem.files import write_json

    os.makedirs(args.out, exist_ok=True)
    try:
        train_pairs, valid_pairs = corpus_pairs(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from seqmem.errors import InfeasibleBudgetError

    run = TrainingRun(args, train_pairs, valid_pairs)
    started = time.time()
    try:
        log = run.train()
    except InfeasibleBudgetError as error:  # a bucket's step cannot fit: say so, without a traceback
        print(f"error: --swap under {args.memory_budget_mb} MB: {error}", file=sys.stderr)
        return 1
    log["seconds"] = time.time() - started
    path = write_json(log, os.path.join(args.out, "log.json"))
    print(f"final validation BLEU {log['bleu'][-1]['bleu']:.1f} after {args.steps} steps "
          f"({log['seconds']:.0f} s); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
