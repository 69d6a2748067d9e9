"""Largest batch per worker without and with seqmem, on one `MultiWorkerMirroredStrategy` worker and on two.

    python -m models.zoo.worker_batches [--model resnet50] [--budget-mb 512] [--precision 0.05] [--reserved-arena]

Each probe is `models.zoo.workers.run_workers` at one batch per worker: every worker a fresh process forked
from seqmem's fork server, with its own emulated device of `--budget-mb` MiB (one stream, op determinism;
reserved up front, as a GPU's arena, with `--reserved-arena`), training two calls of a `strategy.run` step, as
written (B_base) or through `seqmem.optimize` under `strategy.scope()` for that budget (B_opt). A batch fits
when every worker trained both calls with finite losses; one that runs out of memory, or whose plan does not
fit, does not (real out-of-memory errors, no prediction). The search doubles, then bisects to `--precision`
(`seqmem.bench.batch_search.largest_batch`); B_opt's search starts at B_base (or `--opt-start`). Prints
B_base, B_opt and their ratio for each worker count, and writes them to `--out`/worker-batches.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Optional

from models.zoo.workers import MODELS, NMT_SHAPE, run_workers

__all__ = ["trains_on_workers"]


def trains_on_workers(batch: int, model: str, budget_mb: int, optimized: bool, workers: int,
                      reserved_arena: bool = False) -> bool:
    """A `largest_batch` probe: whether `workers` workers each train two calls of `model` at `batch` images
    per worker on devices of `budget_mb` MiB (through `seqmem.optimize` when `optimized`; each device's
    arena reserved up front with `reserved_arena`). Raises
    ResourceExhaustedError when a worker ran out of memory (an all-reduce aborted by it says so too), the
    worker's InfeasibleBudgetError when no plan fits, RuntimeError for anything else a worker raised."""
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime import stall_watch

    with stall_watch.expected_idle():  # waiting on the workers, not stalled
        results = run_workers(model, batch, budget_mb, budget_mb if optimized else None, 2, workers=workers,
                              reserved_arena=reserved_arena)
    failed = [result for result in results if "losses" not in result]
    if not failed:
        return all(math.isfinite(loss) for result in results for loss in result["losses"])
    infeasible = [result["infeasible"] for result in failed if "infeasible" in result]
    if infeasible:
        raise InfeasibleBudgetError(infeasible[0])
    if any(result.get("error") == "ResourceExhaustedError" or "OOM" in result.get("message", "") for result in failed):
        import tensorflow as tf

        raise tf.errors.ResourceExhaustedError(None, None, f"a worker ran out of memory at batch {batch}")
    raise RuntimeError(f"worker failed: {failed[0].get('error')}: {failed[0].get('message', '')[-500:]}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.zoo.worker_batches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="resnet50",
                        help="a Keras model (32x32 images, 10 classes) or nmt (models.zoo.workers)")
    parser.add_argument("--budget-mb", type=int, default=512, help="each worker's emulated device, MiB")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--max-batch", type=int, default=1024, help="largest batch per worker tried")
    parser.add_argument("--opt-start", type=int, default=1,
                        help="B_opt's search starts at the larger of B_base and this batch per worker (one known "
                             "to train with seqmem saves the probes below it)")
    parser.add_argument("--precision", type=float, default=0.05, help="stop once each batch is known within this fraction")
    parser.add_argument("--timeout-s", type=int, default=1800, help="limit for one probe")
    parser.add_argument("--reserved-arena", action="store_true",
                        help="reserve each worker's arena up front, as a GPU's, instead of growing it")
    parser.add_argument("--out", default="worker-batches", help="folder for worker-batches.json")
    args = parser.parse_args(argv)
    try:
        counts = [int(count) for count in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers must be comma-separated worker counts, got {args.workers!r}")
    if not counts or min(counts) < 1:
        parser.error(f"--workers must be positive, got {args.workers!r}")
    if args.budget_mb <= 0 or args.max_batch <= 0 or args.opt_start <= 0 or not 0 <= args.precision < 1:
        parser.error("--budget-mb, --max-batch and --opt-start must be positive and --precision in [0, 1)")
    from models.zoo import worker_batches  # children unpickle the probe by its module's name, not __main__
    from seqmem.bench.batch_search import largest_batch

    rows = []
    for count in counts:
        found = {}
        for label, optimized in (("base", False), ("opt", True)):
            start = max(found["base"].batch, args.opt_start) if optimized else 1
            found[label] = largest_batch(worker_batches.trains_on_workers, args.model, args.budget_mb, optimized, count,
                                         args.reserved_arena, budget_mb=args.budget_mb, limit=args.max_batch,
                                         start=min(start, args.max_batch),
                                         precision=args.precision, timeout_s=args.timeout_s,
                                         on_probe=lambda batch, verdict: print(f"  {count} worker(s), {label} {batch}: "
                                                                               f"{verdict}", flush=True))
        rows.append({"workers": count, "base": found["base"].batch, "opt": found["opt"].batch,
                     "notes": found["base"].notes + found["opt"].notes})
    shape = "T = {}, {} units, vocabulary {}".format(*NMT_SHAPE) if args.model == "nmt" else "32x32, 10 classes"
    arena = "reserved" if args.reserved_arena else "growing"
    print(f"{args.model}, {shape}, {args.budget_mb} MB per worker ({arena} arenas), batches per worker within "
          f"{args.precision:.0%}\n| workers | B_base | B_opt | B_opt / B_base |\n|---:|---:|---:|---:|")
    for row in rows:
        ratio = f"{row['opt'] / row['base']:.2f}x" if row["base"] else "-"
        print(f"| {row['workers']} | {row['base']} | {row['opt']} | {ratio} |")
        for note in row["notes"]:
            print(f"  note ({row['workers']} worker(s)): {note}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "worker-batches.json.part"), "w") as file:
        json.dump({"args": vars(args), "rows": rows}, file, indent=1)
    os.replace(os.path.join(args.out, "worker-batches.json.part"), os.path.join(args.out, "worker-batches.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
