"""One attention layer's training memory: Keras' `MultiHeadAttention` against seqmem's blocked one.

The step: one self-attention layer (causal mask, --heads heads of --key-dim, model width heads * key-dim)
on a [batch, T, width] input, its output's mean square as the loss, and an SGD update of the layer's
weights: the layer's forward pass and its backward, nothing else. Two measurements, each job in a fresh
emulated-device process (one stream):

1. peak and step time at --length T and --batch: 3 measured calls after a warm-up, in a --device-mb arena;
2. the largest T that trains two calls at --search-batch under --budget-mb, by real out-of-memory errors
   (doubling from --search-start, then bisecting to --precision; capped at --search-limit).

    python -m models.transformer.attention_memory             # T = 1024, batch 4; search at batch 1, 1024 MB
    python -m models.transformer.attention_memory --quick     # T = 256, search capped at 2048 (about a minute)
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from seqmem.bench.batch_search import largest_batch
from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

LAYERS = ("keras", "seqmem")


def training_step(layer_name: str, length: int, batch: int, heads: int, key_dim: int, block: int | None):
    """(step, inputs): a tf.function training one `layer_name` attention layer on a [batch, length,
    heads * key_dim] input; the step returns its loss."""
    import tensorflow as tf

    from seqmem.layers.multi_head_attention import MemoryEfficientMultiHeadAttention

    if layer_name == "keras":
        layer = tf.keras.layers.MultiHeadAttention(heads, key_dim)
    else:
        layer = MemoryEfficientMultiHeadAttention(heads, key_dim, query_block_size=block, key_block_size=block)
    inputs = tf.random.stateless_normal([batch, length, heads * key_dim], seed=[1, 2])
    layer(inputs[:, :2], inputs[:, :2])  # builds the weights
    optimizer = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(layer(inputs, inputs, use_causal_mask=True, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_weights), layer.trainable_weights))
        return loss

    return step, (inputs,)


def measured(length: int, layer_name: str, batch: int, heads: int, key_dim: int, block: int | None) -> dict[str, Any]:
    """Child process: the highest peak (bytes) and the median seconds of 3 calls after a warm-up."""
    from seqmem.runtime.measure import timed_steps

    step, inputs = training_step(layer_name, length, batch, heads, key_dim, block)
    peaks, seconds = timed_steps(step, inputs, 3)
    return {"peak_bytes": max(peaks), "median_step_s": sorted(seconds)[1]}


def trains(length: int, layer_name: str, batch: int, heads: int, key_dim: int, block: int | None) -> bool:
    """Child process: whether two calls at `length` run and give finite losses."""
    import math

    step, inputs = training_step(layer_name, length, batch, heads, key_dim, block)
    return all(math.isfinite(float(step(*inputs))) for _ in range(2))


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=1024, help="T of the measured peaks")
    parser.add_argument("--batch", type=int, default=4, help="batch of the measured peaks")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=None,
                        help="seqmem's query and key block size (default: the layer's, from the batch and heads)")
    parser.add_argument("--device-mb", type=int, default=4096, help="arena of the measured peaks (MiB)")
    parser.add_argument("--budget-mb", type=int, default=1024, help="arena of the T search (MiB)")
    parser.add_argument("--search-batch", type=int, default=1)
    parser.add_argument("--search-start", type=int, default=1024)
    parser.add_argument("--search-limit", type=int, default=16384)
    parser.add_argument("--precision", type=float, default=0.05)
    parser.add_argument("--quick", action="store_true", help="T = 256 and the search capped at 2048")
    args = parser.parse_args(argv)
    if args.quick:
        args.length, args.search_start, args.search_limit = 256, 256, 2048
    return args


def main(argv=None) -> None:
    args = _arguments(argv)
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.transformer.attention_memory import measured, trains

    shape = (args.heads, args.key_dim, args.block)
    blocks = f"blocks of {args.block}" if args.block else "default blocks"
    print(f"# One self-attention layer, forward + backward + SGD update ({args.heads} heads x {args.key_dim}, "
          f"causal mask; seqmem {blocks}); emulated device, one stream; "
          f"{datetime.date.today().isoformat()}\n")
    print(f"## Peak at T = {args.length}, batch {args.batch} ({args.device_mb} MB arena, 3 calls after a warm-up)\n")
    print("| layer | peak MB | step s |\n|---|---:|---:|")
    for name in LAYERS:
        run = run_with_budget(measured, args.length, name, args.batch, *shape, budget_mb=args.device_mb,
                              timeout_s=1800)
        cells = (f"{run.value['peak_bytes'] / MIB:.1f} | {run.value['median_step_s']:.3f}" if run.ok
                 else f"{run.verdict} | -")
        print(f"| {name} | {cells} |", flush=True)
    print(f"\n## Largest T that trains at batch {args.search_batch} under {args.budget_mb} MB "
          f"(two calls, real OOM; doubling from {args.search_start}, precision {args.precision}, "
          f"limit {args.search_limit})\n")
    print("| layer | largest T | notes |\n|---|---:|---|")
    for name in LAYERS:
        search = largest_batch(trains, name, args.search_batch, *shape, budget_mb=args.budget_mb,
                               limit=args.search_limit, start=args.search_start, precision=args.precision,
                               timeout_s=1800)
        at_limit = " (the limit)" if search.batch == args.search_limit else ""
        print(f"| {name} | {search.batch}{at_limit} | {'; '.join(search.notes) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
