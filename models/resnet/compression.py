"""Does compressing conserved activations change training? ResNet loss curves with and without it.

Trains one ResNet from the same initial weights on the same synthetic batches
(--batches fixed batches of random images and labels, cycled: the network
learns them by heart, so the loss falls steadily) for --steps steps, each run in
a fresh emulated-device process with op determinism:

    original        the training step as written
    lossless        seqmem.optimize, kinds swap + recompute (computes exactly what the original does)
    float16         seqmem.optimize, kinds compress only: every conserved activation kept as float16
    bfloat16        the same with bfloat16

Each optimized step is planned for the lowest of 70, 80 and 90% of the step's
predicted peak that has a plan, so that it conserves what it can. Writes the
loss curves in one PNG and the losses, final loss (mean of the last 10% of
steps), training accuracy and kinds used per run as JSON.

    python -m models.resnet.compression                # ResNet-20, 32x32, batch 64, 300 steps
    python -m models.resnet.compression --quick        # 40 steps: a check that it runs
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional

from seqmem.files import save_figure, write_json
from seqmem.runtime.device import run_with_budget

RUNS = {
    "original": None,
    "lossless": {"kinds": ("swap", "recompute")},
    "float16": {"kinds": ("compress",), "compression": "float16"},
    "bfloat16": {"kinds": ("compress",), "compression": "bfloat16"},
}
_FRACTIONS = (0.7, 0.8, 0.9)


def train(depth: int, image_size: int, batch: int, batches: int, steps: int,
          options: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Child process: losses of `steps` SGD steps over `batches` fixed synthetic batches, the step optimized
    with `options` (of seqmem.optimize) unless None; with the training accuracy after the last step and the
    kinds the plan used."""
    import numpy as np
    import tensorflow as tf

    from models.resnet.benchmark import model_and_step
    from models.resnet.data import synthetic_batch
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime.optimize import optimize
    from seqmem.runtime.step_analysis import predicted_peak_bytes

    tf.config.experimental.enable_op_determinism()
    classes = 10
    model, step, specs = model_and_step(batch, depth, image_size, classes)
    data = [synthetic_batch(batch, image_size, classes, seed=seed) for seed in range(batches)]
    kinds: list[str] = []
    if options is not None:
        peak = predicted_peak_bytes(step.get_concrete_function(*specs))
        for fraction in _FRACTIONS:
            try:
                step = optimize(step, fraction * peak / (1 << 20), input_signature=specs, sample_inputs=data[0],
                                safety_margin=0.0, calibrate=False, **options)
                break
            except InfeasibleBudgetError:
                continue
        else:
            raise InfeasibleBudgetError(f"no plan under {_FRACTIONS[-1]:.0%} of the predicted peak "
                                        f"({peak / (1 << 20):.1f} MB) with {options}")
        kinds = sorted({decision.kind.name for decision in step.plan.decisions})
    losses = [float(step(*data[i % batches])) for i in range(steps)]
    correct = sum(int(np.sum(np.argmax(model(images, training=False), axis=1) == labels.numpy()))
                  for images, labels in data)
    return {"losses": losses, "accuracy": correct / (batch * batches), "kinds": kinds}


def final_loss(losses: list[float]) -> float:
    """Mean loss over the last 10% of the steps (at least one)."""
    tail = losses[-max(1, len(losses) // 10):]
    return sum(tail) / len(tail)


def loss_chart(path: str, runs: dict[str, dict[str, Any]], title: str) -> str:
    """PNG of each run's loss per step, in one chart; appears whole or not at all. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, run in runs.items():
        if "losses" in run:
            axes.plot(run["losses"], label=f"{name} (final {final_loss(run['losses']):.4g})", linewidth=1)
    axes.set_yscale("log")
    axes.set_xlabel("training step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    return save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="40 steps")
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth, 9n + 2")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=4, help="fixed synthetic batches, cycled")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device-mb", type=int, default=4096, help="emulated device of each run (MiB)")
    parser.add_argument("--out", default="compression-accuracy", help="folder for the JSON and the PNG")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 40)
    if min(args.depth, args.image_size, args.batch, args.batches, args.steps, args.device_mb) < 1:
        parser.error("depth, sizes, batches, steps and the device must be positive")
    if args.depth < 11 or (args.depth - 2) % 9:
        parser.error(f"--depth must be 9n + 2 (11, 20, 29, ...), got {args.depth}")
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.resnet import compression

    report: dict[str, Any] = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "runs": {}}
    for name, options in RUNS.items():
        run = run_with_budget(compression.train, args.depth, args.image_size, args.batch, args.batches, args.steps,
                              options, budget_mb=args.device_mb, timeout_s=3600)
        report["runs"][name] = run.value if run.ok else {"error": run.verdict, "message": run.message[-500:]}
        print(format_row(name, report["runs"][name]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    title = (f"ResNet-{args.depth}, {args.image_size}x{args.image_size}, batch {args.batch}: "
             f"loss with and without compression")
    png = loss_chart(os.path.join(args.out, "compression-loss.png"), report["runs"], title)
    path = write_json(report, os.path.join(args.out, "compression-accuracy.json"))
    print(f"wrote {path} and {png}")
    return 0


def format_row(name: str, run: dict[str, Any]) -> str:
    """One run as a Markdown table row: name, kinds, final loss, training accuracy."""
    if "error" in run:
        return f"| {name} | {run['error']} | - | - |"
    return f"| {name} | {', '.join(run['kinds']) or '-'} | {final_loss(run['losses']):.4g} | {run['accuracy']:.3f} |"


if __name__ == "__main__":
    sys.exit(main())
