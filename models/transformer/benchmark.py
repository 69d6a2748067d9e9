"""Transformer NMT batch size under a memory budget, per technique, measured.

For a Transformer encoder-decoder training step (`models.transformer.model`: --layers + --layers layers,
--model-dim, --heads heads, feed-forward 4 x model-dim, vocabulary --vocab, dropout 0.1, Adam; source and
target of T tokens) at each T, on the emulated device (every probe a fresh process, real OOM), the largest
batch that trains two full steps under --budget-mb for six variants:

    base        Keras' MultiHeadAttention and cross-entropy over the [B, T, V] logits    (B_base)
    swap        base + seqmem.optimize (feature maps swapped)
    attention   seqmem's MemoryEfficientMultiHeadAttention
    loss        seqmem's blocked softmax cross-entropy in the model's code (seqmem.layers.softmax_loss)
    head        base + seqmem.optimize with kinds ("blocked-head",): the vocabulary head blocked, no code change
    all         efficient attention + seqmem.optimize with kinds ("swap", "blocked-head")

and, at B_base for every variant (in an arena of twice the budget): the measured peak beside seqmem's
predicted one, and training throughput in target tokens per second.

    python -m models.transformer.benchmark                  # T = 128, 256, 512, 1024; 1024 MB, one stream
    python -m models.transformer.benchmark --quick          # T = 32, a small model, batches within 50%
    python -m models.transformer.benchmark --time-steps 128 --at-batch 16 --measure-runs 3

Writes transformer-benchmark.json and transformer-batch.png under --out.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from seqmem.bench.suite import Suite, add_arguments, checked_arguments, run
from seqmem.bench.workload import Workload
from seqmem.bench.workload import measure as measure_workload

# variant: (attention, loss, the kinds seqmem.optimize conserves by; () for a step run as it is)
VARIANTS = {"base": ("keras", "keras", ()), "swap": ("keras", "keras", ("swap",)),
            "attention": ("efficient", "keras", ()), "loss": ("keras", "efficient", ()),
            "head": ("keras", "keras", ("blocked-head",)), "all": ("efficient", "keras", ("swap", "blocked-head"))}
COLUMNS = {"base": "B_base (Keras)", "swap": "swap", "attention": "efficient attention", "loss": "blocked loss",
           "head": "blocked head", "all": "all"}
SUITE = Suite("transformer", "models.transformer.benchmark", COLUMNS, ("layers", "model_dim", "heads", "vocab"),
              "Transformer NMT under {budget_mb} MB (emulated device, measured)")


def training_step(batch: int, time_steps: int, layers: int, model_dim: int, heads: int, vocab: int,
                  attention: str = "keras", loss: str = "keras"):
    """(training step, inputs, input specs) of the Transformer with `attention` and `loss` ("keras" or
    "efficient"), every sentence T tokens long."""
    import tensorflow as tf

    from models.transformer.model import TransformerConfig, TransformerModel, make_train_step
    from seqmem.runtime.device import on_device

    tf.keras.utils.set_random_seed(0)
    model = TransformerModel(TransformerConfig(
        source_vocab=vocab, target_vocab=vocab, model_dim=model_dim, heads=heads, layers=layers,
        feed_forward=4 * model_dim, max_length=max(time_steps, 2), attention=attention, loss=loss))
    rng = np.random.default_rng(0)
    tokens = lambda: on_device(rng.integers(1, vocab, (batch, time_steps)).astype(np.int32))  # noqa: E731
    lengths = tf.fill([batch], time_steps)
    inputs = (tokens(), lengths, tokens(), tokens(), lengths)
    return make_train_step(model), inputs, [tf.TensorSpec(t.shape, t.dtype) for t in inputs]


def workload(variant: str, time_steps: int, layers: int, model_dim: int, heads: int, vocab: int,
             budget_mb: int) -> Workload:
    """One of VARIANTS as a benchmark workload: variants with kinds are optimized for `budget_mb`."""
    attention, loss, kinds = VARIANTS[variant]
    options = (("time_steps", time_steps), ("layers", layers), ("model_dim", model_dim), ("heads", heads),
               ("vocab", vocab), ("attention", attention), ("loss", loss))
    return Workload(training_step, options, optimized=bool(kinds), budget_mb=budget_mb, kinds=kinds or ("swap",))


def measure(variant: str, batch: int, time_steps: int, layers: int, model_dim: int, heads: int, vocab: int,
            budget_mb: int) -> dict[str, Any]:
    """Child process: `seqmem.bench.workload.measure` of a variant, with its throughput in target tokens/s."""
    measured = measure_workload(batch, workload(variant, time_steps, layers, model_dim, heads, vocab, budget_mb))
    return {**measured, "tokens_per_s": batch * time_steps / measured["median_step_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="T = 32 only, 1 + 1 layers of 32, vocabulary 200, 128 MB, batches within 50%%")
    parser.add_argument("--layers", type=int, default=4, help="encoder layers (and as many decoder layers)")
    parser.add_argument("--model-dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8000)
    add_arguments(parser, SUITE, time_steps="128,256,512,1024", executor="one-stream")
    args = parser.parse_args(argv)
    if args.quick:
        args.time_steps, args.layers, args.model_dim, args.vocab, args.budget_mb = "32", 1, 32, 200, 128
        args.max_batch = min(args.max_batch, 512)
        args.precision, args.timeout_s = max(args.precision, 0.5), min(args.timeout_s, 300)
    time_steps, variants = checked_arguments(parser, SUITE, args)
    if args.model_dim % args.heads:
        parser.error(f"--heads must divide --model-dim, got {args.heads} and {args.model_dim}")
    print(run(SUITE, args, time_steps, variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
