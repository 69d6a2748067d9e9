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
import sys
from typing import Any

import numpy as np

from seqmem.bench.suite import Suite, add_arguments, checked_arguments, run
from seqmem.bench.workload import Workload
from seqmem.bench.workload import measure as measure_workload

# variant: (attention, cells, loss, optimized by seqmem)
VARIANTS = {"base": ("tfa", "keras", "keras", False), "swap": ("tfa", "keras", "keras", True),
            "efficient": ("efficient", "keras", "keras", False), "both": ("efficient", "keras", "keras", True),
            "cells": ("tfa", "efficient", "keras", False), "loss": ("tfa", "keras", "efficient", False),
            "all": ("efficient", "efficient", "efficient", True)}
COLUMNS = {"base": "B_base (tfa)", "swap": "swap", "efficient": "efficient attention", "both": "both",
           "cells": "efficient cells", "loss": "blocked loss", "all": "all"}
SUITE = Suite("nmt", "models.nmt.benchmark", COLUMNS, ("units", "vocab"),
              "NMT under {budget_mb} MB (emulated device, measured)")


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
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    # default pool: on one stream the decoder's gradient loop runs up to 32 iterations ahead in an order, and
    # so with a peak, that varies far more
    add_arguments(parser, SUITE, time_steps="50,100,200,400", executor="pool")
    args = parser.parse_args(argv)
    if args.quick:
        args.time_steps, args.units, args.vocab, args.budget_mb = "30", 64, 200, 128
        args.max_batch = min(args.max_batch, 512)
        args.precision, args.timeout_s = max(args.precision, 0.5), min(args.timeout_s, 300)
    time_steps, variants = checked_arguments(parser, SUITE, args)
    print(run(SUITE, args, time_steps, variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
