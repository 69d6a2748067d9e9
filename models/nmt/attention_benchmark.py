"""Memory and speed of tfa's BahdanauAttention vs seqmem's MemoryEfficientBahdanauAttention.

For an NMT training step (LSTM encoder/decoder, source and target of T tokens)
at each T: the measured peak at a fixed batch, the largest batch that trains
(two full steps, real OOM) under a budget on the emulated device, and the step
time at T=100. Every measurement runs in a fresh process (seqmem.device).

    python -m models.nmt.attention_benchmark            # T = 50, 100, 200; budget 1024 MB
    python -m models.nmt.attention_benchmark --quick    # T = 50 only, smaller search
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from seqmem.device import run_with_budget

ATTENTIONS = ("tfa", "efficient")
_MB = 1 << 20


def _inputs(batch: int, time_steps: int, vocab: int):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    tokens = lambda: tf.constant(rng.integers(1, vocab, (batch, time_steps)), tf.int32)  # noqa: E731
    lengths = tf.fill([batch], time_steps)
    return tokens(), lengths, tokens(), tokens(), lengths


def _step(attention: str, batch: int, time_steps: int, units: int, vocab: int):
    from models.nmt.model import NMTConfig, NMTModel, make_train_step

    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = NMTModel(NMTConfig(source_vocab=vocab, target_vocab=vocab, units=units, attention=attention))
    return make_train_step(model), _inputs(batch, time_steps, vocab)


def peak_bytes(attention: str, batch: int, time_steps: int, units: int = 256, vocab: int = 1000, steps: int = 5) -> int:
    """Child process: the median over `steps` training steps (after a warm-up) of the device's peak bytes.

    Peaks vary from step to step: the executor runs loop iterations and
    independent ops concurrently, in varying order.
    """
    from seqmem import device

    step, args = _step(attention, batch, time_steps, units, vocab)
    step(*args).numpy()
    peaks = []
    for _ in range(steps):
        device.reset_peak()
        step(*args).numpy()
        peaks.append(device.memory_stats().peak_bytes)
    return sorted(peaks)[len(peaks) // 2]


def trains(attention: str, batch: int, time_steps: int, units: int = 256, vocab: int = 1000) -> bool:
    """Child process: two full training steps; True if both ran and the loss is finite."""
    step, args = _step(attention, batch, time_steps, units, vocab)
    losses = [float(step(*args)) for _ in range(2)]
    return all(np.isfinite(losses))


def step_seconds(attention: str, batch: int, time_steps: int, steps: int, units: int = 256, vocab: int = 1000) -> float:
    """Child process: mean wall-clock seconds of a training step after two warm-up steps."""
    step, args = _step(attention, batch, time_steps, units, vocab)
    for _ in range(2):
        step(*args).numpy()
    started = time.perf_counter()
    for _ in range(steps):
        step(*args).numpy()
    return (time.perf_counter() - started) / steps


def largest_batch(attention: str, time_steps: int, budget_mb: int, limit: int, units: int, progress) -> tuple[int, list[str]]:
    """Largest batch <= limit whose two steps train under `budget_mb`; also the failed probes' verdicts."""
    notes = []

    def fits(batch: int) -> bool:
        run = run_with_budget(trains, attention, batch, time_steps, units, budget_mb=budget_mb, timeout_s=600)
        progress.update(1)
        if run.verdict not in ("ok", "oom"):
            notes.append(f"batch {batch}: {run.verdict}")
        return run.ok and bool(run.value)

    low, high = 0, 1
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T = 50 only, batch search up to 64")
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--peak-batch", type=int, default=8, help="batch at which peaks are measured")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--out", default="attention-benchmark.json")
    args = parser.parse_args(argv)
    if min(args.budget_mb, args.units, args.peak_batch, args.max_batch) < 1:
        parser.error("--budget-mb, --units, --peak-batch and --max-batch must be positive")
    # Children unpickle functions by module name: use this module's importable name, not __main__.
    from models.nmt import attention_benchmark as bench

    time_steps = (50,) if args.quick else (50, 100, 200)
    max_batch = 64 if args.quick else args.max_batch
    rows = []
    with tqdm(desc="probes", unit="run", file=sys.stderr) as progress:
        for steps in time_steps:
            row = {"time_steps": steps}
            for attention in ATTENTIONS:
                run = run_with_budget(bench.peak_bytes, attention, args.peak_batch, steps, args.units, budget_mb=8192)
                progress.update(1)
                row[f"peak_mb_{attention}"] = run.value / _MB if run.ok else run.verdict
                row[f"batch_{attention}"], row[f"notes_{attention}"] = bench.largest_batch(
                    attention, steps, args.budget_mb, max_batch, args.units, progress
                )
            rows.append(row)
        timing_steps = 50 if args.quick else 100
        seconds = {}
        for attention in ATTENTIONS:
            run = run_with_budget(bench.step_seconds, attention, args.peak_batch, timing_steps, 5, args.units, budget_mb=8192)
            progress.update(1)
            seconds[attention] = run.value if run.ok else None

    print(f"\nNMT training step, units {args.units}; peaks (median of 5 steps) at batch {args.peak_batch}; "
          f"largest batch under {args.budget_mb} MB (emulated device)")
    print("| T | peak tfa (MB) | peak efficient (MB) | peak ratio | batch tfa | batch efficient | batch ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        peak_ratio = _ratio(row["peak_mb_tfa"], row["peak_mb_efficient"])
        batch_ratio = _ratio(row["batch_efficient"], row["batch_tfa"])
        print(f"| {row['time_steps']} | {_fmt(row['peak_mb_tfa'])} | {_fmt(row['peak_mb_efficient'])} | {peak_ratio} "
              f"| {row['batch_tfa']} | {row['batch_efficient']} | {batch_ratio} |")
    if all(seconds.values()):
        print(f"\nstep time at T={timing_steps}, batch {args.peak_batch}: tfa {1e3 * seconds['tfa']:.0f} ms, "
              f"efficient {1e3 * seconds['efficient']:.0f} ms ({seconds['efficient'] / seconds['tfa']:.2f}x)")
    partial = args.out + ".partial"
    with open(partial, "w") as out:
        json.dump({"budget_mb": args.budget_mb, "units": args.units, "peak_batch": args.peak_batch, "rows": rows,
                   "step_seconds": seconds, "timing_time_steps": timing_steps}, out, indent=2)
    os.replace(partial, args.out)
    print(f"wrote {args.out}")
    return 0


def _fmt(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _ratio(numerator, denominator) -> str:
    if isinstance(numerator, (int, float)) and isinstance(denominator, (int, float)) and denominator:
        return f"{numerator / denominator:.1f}x"
    return "-"


if __name__ == "__main__":
    sys.exit(main())
