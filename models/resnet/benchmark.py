"""ResNet batch size and depth under a memory budget: the paper's Table 1, measured.

On the emulated device (every probe a fresh process, real OOM), for a ResNet
training step (SGD with momentum, synthetic images):

- Table 1(a): the largest batch that trains two full steps under --budget-mb for
  the baseline and each of --variants: seqmem.optimize swapping ("seqmem"),
  recomputing, compressing to float16, or both compressing and swapping, each
  alone ("seqmem-recompute", "seqmem-fp16", "seqmem-fp16-swap"), choosing
  between swapping and recomputing ("seqmem-lossless") or among all four
  ("seqmem-all"), and tf.recompute_grad around every residual block (the peer,
  "recompute"); B_limit, the largest batch at which the most memory-hungry
  op alone (inputs, outputs, scratch, plus persistent memory) fits; measured and
  predicted peaks and throughput at B_base, seqmem's throughput at B_opt, and
  with several seqmem variants, each one's at the largest batch all of them train.
  --host-memory-mb bounds what seqmem's swaps may hold in host memory.
- Table 1(b): measured peak at --depth-batch for deeper networks, without and
  with seqmem, under --depth-budget-mb (OOM where the step does not fit), and
  the paper's M_opt: the peak of seqmem's lowest plan (swaps), in that arena.
- A PNG of predicted memory over one step at B_base, baseline and seqmem
  (the paper's Figure 1 before and after), with the measured peaks.
- With --at-batch, neither table: each variant at that batch under --budget-mb
  in --runs fresh processes, each a row: trained or not, measured and
  predicted peaks, the seconds `seqmem.optimize` took (calibration included),
  throughput.

    python -m models.resnet.benchmark                 # ResNet-50 at 64x64, 1024 MB; depths 101/200/1001/2000
    python -m models.resnet.benchmark --quick         # ResNet-20 at 32x32, 256 MB: a few minutes
    python -m models.resnet.benchmark --tables b --depths 2000   # one row of Table 1(b) only
    python -m models.resnet.benchmark --at-batch 654 --variants seqmem --runs 3   # one batch: trains? in what?
    python -m models.resnet.benchmark --tables a --variants seqmem,seqmem-lossless,seqmem-all \
        --host-memory-mb 512                          # the kinds where host memory bounds the swaps
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from seqmem.bench.batch_search import extrapolated_batch, largest_batch
from seqmem.bench.report import EXECUTORS, ratio, search_settings, value_or_verdict
from seqmem.bench.workload import Workload, trains
from seqmem.bench.workload import measure as measure_workload
from seqmem.bench.workload import measure_smallest as smallest_workload
from seqmem.files import write_json
from seqmem.runtime.device import run_with_budget
from seqmem.units import MIB

# how each seqmem variant may conserve a tensor (see seqmem.optimize): one kind alone, or several, the
# selector choosing per tensor
SEQMEM_KINDS = {
    "seqmem": {"kinds": ("swap",)},
    "seqmem-recompute": {"kinds": ("recompute",)},
    "seqmem-fp16": {"kinds": ("compress",), "compression": "float16"},
    "seqmem-fp16-swap": {"kinds": ("compress+swap",), "compression": "float16"},
    "seqmem-lossless": {"kinds": ("swap", "recompute")},
    "seqmem-all": {"kinds": ("swap", "recompute", "compress", "compress+swap"), "compression": "float16"},
}
VARIANTS = ("baseline", *SEQMEM_KINDS, "recompute")


def model_and_step(batch: int, depth: int, image_size: int, classes: int, recompute: bool = False):
    """(Keras model, training step, input specs) of one ResNet training step, SGD with momentum;
    `recompute`: tf.recompute_grad per block. The step takes (images, labels) and returns the loss."""
    import tensorflow as tf

    from models.resnet.model import resnet

    tf.keras.utils.set_random_seed(0)
    model = resnet(depth, image_size, classes, recompute=recompute)
    optimizer = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)  # slots now, or the step's first call traces it twice
    specs = (tf.TensorSpec([batch, image_size, image_size, 3]), tf.TensorSpec([batch], tf.int32))

    @tf.function(input_signature=specs, autograph=False)  # plain TensorFlow: nothing to convert
    def step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return model, step, specs


def training_step(batch: int, depth: int, image_size: int, classes: int, recompute: bool = False):
    """(step, inputs, input specs) of `model_and_step`'s step on a synthetic batch: a `bench.workload` builder."""
    from models.resnet.data import synthetic_batch

    _, step, specs = model_and_step(batch, depth, image_size, classes, recompute)
    return step, synthetic_batch(batch, image_size, classes), specs


def workload(variant: str, depth: int, image_size: int, classes: int, budget_mb: int,
             host_memory_mb: float | None = None) -> Workload:
    """One of VARIANTS as a benchmark workload: seqmem's steps are optimized for `budget_mb`, their swaps
    within `host_memory_mb` MiB of host memory (None: `optimize`'s default)."""
    options = (("depth", depth), ("image_size", image_size), ("classes", classes),
               ("recompute", variant == "recompute"))
    return Workload(training_step, options, optimized=variant in SEQMEM_KINDS, budget_mb=budget_mb,
                    host_memory_mb=host_memory_mb, **SEQMEM_KINDS.get(variant, {}))


def measure(variant: str, depth: int, batch: int, image_size: int, classes: int, budget_mb: int,
            host_memory_mb: float | None = None) -> dict[str, Any]:
    """Child process: `seqmem.bench.workload.measure` of a variant, with its throughput in images/s."""
    measured = measure_workload(batch, workload(variant, depth, image_size, classes, budget_mb, host_memory_mb))
    return {**measured, "images_per_s": batch / measured["median_step_s"]}


def measure_smallest(depth: int, batch: int, image_size: int, classes: int, variant: str = "seqmem",
                     host_memory_mb: float | None = None) -> dict[str, Any]:
    """Child process: `seqmem.bench.workload.measure_smallest` (the paper's M_opt) of a seqmem variant (one
    of SEQMEM_KINDS: the kinds its plan may use), with its throughput in images/s."""
    if variant not in SEQMEM_KINDS:
        raise ValueError(f"variant must be one of {sorted(SEQMEM_KINDS)}, got {variant!r}")
    measured = smallest_workload(batch, workload(variant, depth, image_size, classes, 1, host_memory_mb))
    return {**measured, "images_per_s": batch / measured["median_step_s"]}


def batch_bounds(depth: int, image_size: int, classes: int, budget_mb: int) -> dict[str, Any]:
    """Child process: B_limit, the largest batch whose most memory-hungry op fits beside persistent
    memory, and the batch at which seqmem predicts the baseline's peak reaches the budget.

    An op's footprint is its distinct inputs and outputs (affine in the batch: read from the
    graph at batch 1 and 2) plus its scratch bytes, measured at batch 2 and held constant (this
    CPU's convolution kernels use about the same scratch at batch 8 and 90). The predicted peaks at
    batch 1 and 2 both use measured scratch. Persistent memory
    (weights, optimizer slots) is counted once. Graph bounds and predictions, not measurements.
    """
    from seqmem.ir.graph import TensorRef
    from seqmem.runtime.step_analysis import analyze_function
    from seqmem.sim.simulator import simulate

    tensor_bytes, peaks = [], []
    for batch in (1, 2):
        step, _, specs = training_step(batch, depth, image_size, classes)
        analysis = analyze_function(step.get_concrete_function(*specs), measure_scratch=True)
        graph = analysis.graph
        tensor_bytes.append({
            name: sum(graph.tensor(ref).size_bytes or 0
                      for ref in set(node.inputs) | {TensorRef(name, i) for i in range(len(node.outputs))})
            for name, node in graph.nodes.items()
        })
        trace = simulate(graph, analysis.order, allocator="bfc", **analysis.simulator_options())
        peaks.append(trace.peak_bytes)
    scratch, persistent = analysis.scratch_bytes, trace.busiest().persistent_bytes
    budget = budget_mb * MIB - persistent
    limit, limiting = None, None
    for name, at_two in tensor_bytes[1].items():
        per_image = at_two - tensor_bytes[0].get(name, at_two)
        if per_image > 0:
            fits = (budget - scratch.get(name, 0) - (at_two - 2 * per_image)) // per_image
            if limit is None or fits < limit:
                limit, limiting = fits, name
    return {"batch": max(int(limit or 0), 0), "op": limiting, "persistent_bytes": persistent,
            "predicted_base_batch": extrapolated_batch(peaks[0], peaks[1], budget_mb * MIB)}


def memory_curves(depth: int, batch: int, image_size: int, classes: int, budget_mb: int, path: str,
                  host_memory_mb: float | None = None) -> str:
    """Child process: PNG of predicted memory over one step at `batch`, baseline and the plan `optimize`
    makes (swaps) for `budget_mb` and `host_memory_mb` (uncalibrated: this process's arena need not be the
    budget)."""
    from seqmem.plot import plot_plan
    from seqmem.runtime.optimize import optimize

    step, _, specs = training_step(batch, depth, image_size, classes)
    optimized = optimize(step, budget_mb, input_signature=specs, calibrate=False, host_memory_mb=host_memory_mb)
    return plot_plan(path, optimized.analysis, optimized.plan,
                     title=f"ResNet-{depth}, batch {batch}, {image_size}x{image_size}: predicted memory over one step")


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[int], tuple[str, ...]]:
    """The benchmark's flags, checked (the parser exits with a message on a bad one): the arguments, Table
    1(b)'s depths, and the variants besides the baseline."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="ResNet-20 at 32x32, 10 classes, 256 MB, batches within 25%%; ResNet-47 at batch 48: a few minutes")
    parser.add_argument("--depth", type=int, default=50, help="network of Table 1(a) (50, 101, 152, 200 or 9n+2)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=2048)
    parser.add_argument("--host-memory-mb", type=float, default=None,
                        help="the most host memory seqmem's swaps may hold, MiB (default: optimize's, three "
                             "quarters of what the host has available)")
    parser.add_argument("--precision", type=float, default=0.03,
                        help="stop the batch search once the answer is known within this fraction (0: exact)")
    parser.add_argument("--tables", choices=("a", "b", "ab"), default="ab", help="which of Table 1(a) and 1(b) to run")
    parser.add_argument("--variants", default="seqmem,recompute",
                        help=f"Table 1(a)'s variants besides the baseline, comma-separated, of {VARIANTS[1:]}")
    parser.add_argument("--depths", default="101,200,1001,2000", help="networks of Table 1(b), comma-separated")
    parser.add_argument("--depth-batch", type=int, default=8, help="batch of Table 1(b)")
    parser.add_argument("--depth-image-size", type=int, default=32, help="image size of Table 1(b)")
    parser.add_argument("--depth-budget-mb", type=int, default=1536, help="budget of Table 1(b)")
    parser.add_argument("--timeout-s", type=int, default=1800, help="limit for one probe process")
    parser.add_argument("--executor", choices=EXECUTORS, default="one-stream", help="the emulated device's executor")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes a batch must train in to count as fitting")
    parser.add_argument("--at-batch", type=int, default=None,
                        help="no tables: each of --variants (and 'baseline' if listed) at this batch, --runs times")
    parser.add_argument("--batches-only", action="store_true",
                        help="Table 1(a)'s batches alone: no peaks and throughput at B_base and B_opt, no memory chart")
    parser.add_argument("--jobs", type=int, default=1,
                        help="probe processes side by side in batch searches (more than 1 changes the order ops run in)")
    parser.add_argument("--out", default="resnet-benchmark", help="folder for the JSON and the PNG")
    args = parser.parse_args(argv)
    if args.quick:
        args.depth, args.image_size, args.classes, args.budget_mb = 20, 32, 10, 256
        args.max_batch = min(args.max_batch, 256)
        args.precision, args.timeout_s = max(args.precision, 0.25), min(args.timeout_s, 300)
        args.depths, args.depth_batch, args.depth_budget_mb = "47", 48, 256
    try:
        depths = [int(d) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--depths must be comma-separated integers, got {args.depths!r}")
    if min([args.image_size, args.classes, args.budget_mb, args.max_batch, args.depth_batch, args.depth_image_size,
            args.depth_budget_mb, args.timeout_s, args.jobs, args.runs] + depths) < 1:
        parser.error("sizes, budgets, batches, depths, the timeout, jobs and runs must be positive")
    if args.at_batch is not None and args.at_batch < 1:
        parser.error(f"--at-batch must be a positive batch, got {args.at_batch}")
    if args.host_memory_mb is not None and not 0 < args.host_memory_mb < float("inf"):
        parser.error(f"--host-memory-mb must be a positive number, got {args.host_memory_mb}")
    if not 0 <= args.precision < 1:
        parser.error(f"--precision must be in [0, 1), got {args.precision}")
    others = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    allowed = VARIANTS if args.at_batch else VARIANTS[1:]
    if not others or not set(others) <= set(allowed):
        parser.error(f"--variants must be a comma-separated selection of {allowed}, got {args.variants!r}")
    from models.resnet.model import IMAGENET_STAGES

    for depth in [args.depth] + depths:
        if depth not in IMAGENET_STAGES and (depth < 11 or (depth - 2) % 9):
            parser.error(f"depth {depth} is neither one of {sorted(IMAGENET_STAGES)} nor 9n + 2 (e.g. 1001)")
    return args, depths, others


def main(argv: list[str] | None = None) -> int:
    args, depths, others = _arguments(argv)
    # Children unpickle functions by module name: use the importable name, not __main__.
    from models.resnet import benchmark as bench

    os.makedirs(args.out, exist_ok=True)
    report: dict[str, Any] = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "table_a": {}, "table_b": []}
    tables = "" if args.at_batch else args.tables
    with tqdm(desc="probe processes", unit="run", file=sys.stderr) as progress:
        probes = _Probes(args, progress, bench)
        if args.at_batch:
            report["at_batch"] = {variant: [value_or_verdict(probes.run(
                bench.measure, variant, args.depth, args.at_batch, args.image_size, args.classes, args.budget_mb,
                args.host_memory_mb, budget_mb=args.budget_mb)) for _ in range(args.runs)] for variant in others}
        report["at_base"], report["at_opt"] = {}, {}
        if "a" in tables:
            _table_a(probes, others, report)
        for depth in depths if "b" in tables else ():
            report["table_b"].append(_table_b_row(probes, depth))

    print(format_report(report))
    path = write_json(report, os.path.join(args.out, "resnet-benchmark.json"))
    print(f"wrote {path}" + (f" and {report['memory_png']}" if str(report.get("memory_png", "")).endswith(".png") else ""))
    return 0


class _Probes:
    """The benchmark's probe processes, each counted on the progress bar: one run at a batch, or a search."""

    def __init__(self, args: argparse.Namespace, progress, bench) -> None:
        self.args, self.progress, self.bench = args, progress, bench
        self.network = (args.depth, args.image_size, args.classes)

    def run(self, function, *call_args, budget_mb):
        result = run_with_budget(function, *call_args, budget_mb=budget_mb, timeout_s=self.args.timeout_s,
                                 one_stream=self.args.executor == "one-stream")
        self.progress.update(1)
        return result

    def search(self, variant: str, start: int) -> dict[str, Any]:
        args = self.args
        found = largest_batch(trains, self.bench.workload(variant, *self.network, args.budget_mb, args.host_memory_mb),
                              budget_mb=args.budget_mb, limit=args.max_batch, start=start, precision=args.precision,
                              runs=args.runs, one_stream=args.executor == "one-stream", timeout_s=args.timeout_s,
                              on_probe=lambda batch, verdict: self.progress.update(1))
        return {"batch": found.batch, "notes": found.notes}

    def measure(self, variant: str, batch: int, budget_mb: int) -> dict[str, Any]:
        """`measure` of `variant` at `batch` for the benchmark's budget, in an arena of `budget_mb`."""
        args = self.args
        return value_or_verdict(self.run(self.bench.measure, variant, args.depth, batch, args.image_size, args.classes,
                                         args.budget_mb, args.host_memory_mb, budget_mb=budget_mb))


def _table_a(probes: _Probes, others: tuple[str, ...], report: dict[str, Any]) -> None:
    """Table 1(a) into `report`: the largest batch of the baseline and of each variant, and (unless
    --batches-only) peaks and throughput at B_base, at a batch every kind trains, at B_opt, and the chart."""
    args, bench, table_a = probes.args, probes.bench, report["table_a"]
    bounds = probes.run(bench.batch_bounds, *probes.network, args.budget_mb, budget_mb=args.budget_mb)
    table_a["limit"] = value_or_verdict(bounds)
    guess = bounds.value["predicted_base_batch"] if bounds.ok else 1
    table_a["baseline"] = probes.search("baseline", min(guess, args.max_batch))
    base = table_a["baseline"]["batch"]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # independent searches, side by side
        table_a.update(zip(others, pool.map(lambda variant: probes.search(variant, max(base, 1)), others)))
    if not base or args.batches_only:
        return
    # Peaks vary from step to step (the executor runs independent ops concurrently), so B_base, found by two
    # steps, may exceed the budget in a later one: measure at B_base in an arena of twice the budget (seqmem
    # still plans for the budget), at B_opt under the budget itself.
    for variant in ("baseline",) + others:
        report["at_base"][variant] = probes.measure(variant, base, 2 * args.budget_mb)
    kinds = [v for v in others if v in SEQMEM_KINDS]
    common = min((table_a[v]["batch"] for v in kinds), default=0)
    if len(kinds) > 1 and common > base:  # each way of conserving at one batch, like Janssen et al.'s
        report["at_common"] = {"batch": common, "rows": {v: probes.measure(v, common, args.budget_mb) for v in kinds}}
    opt = table_a.get("seqmem", {}).get("batch")
    if opt:
        report["at_opt"]["seqmem"] = probes.measure("seqmem", opt, args.budget_mb)
    curves = os.path.join(args.out, "resnet-memory.png")
    drawn = probes.run(bench.memory_curves, args.depth, opt or base, args.image_size, args.classes, args.budget_mb,
                       curves, args.host_memory_mb, budget_mb=max(4 * args.budget_mb, 4096))
    report["memory_png"] = curves if drawn.ok else drawn.verdict


def _table_b_row(probes: _Probes, depth: int) -> dict[str, Any]:
    """Table 1(b)'s row for `depth`: the baseline and seqmem at the fixed batch, and seqmem's lowest peak."""
    args, bench = probes.args, probes.bench
    row: dict[str, Any] = {"depth": depth}
    for variant in ("baseline", "seqmem"):
        row[variant] = value_or_verdict(probes.run(bench.measure, variant, depth, args.depth_batch,
                                                   args.depth_image_size, 10, args.depth_budget_mb, args.host_memory_mb,
                                                   budget_mb=args.depth_budget_mb))
    row["smallest"] = value_or_verdict(probes.run(bench.measure_smallest, depth, args.depth_batch,
                                                  args.depth_image_size, 10, "seqmem", args.host_memory_mb,
                                                  budget_mb=args.depth_budget_mb))
    return row


def format_report(report: dict[str, Any]) -> str:
    """The benchmark's tables in Markdown, from its JSON report."""
    args, table_a = report["args"], report["table_a"]
    lines = _format_table_a(report) if table_a else []
    if report.get("at_batch"):
        lines += [f"ResNet-{args['depth']}, {args['image_size']}x{args['image_size']}, {args['classes']} classes, "
                  f"batch {args['at_batch']}, emulated device {args['budget_mb']} MB{_host_limit(args)}, "
                  f"one fresh process per run (measured peak: max of 3 steps; throughput: median step):",
                  "| variant | run | measured peak (MB) | predicted peak (MB) | conserved | optimize s | images/s |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for variant, runs in report["at_batch"].items():
            for index, row in enumerate(runs, 1):
                if "error" in row:
                    last = (row.get("message") or "").strip().splitlines()[-1:] or [""]
                    lines.append(f"| {variant} | {index} | {row['error']}: {last[0][:200]} | - | - | - | - |")
                    continue
                optimize_s = f"{row['build_s']:.0f}" if variant in SEQMEM_KINDS else "-"
                lines.append(f"| {variant} | {index} | {row['peak_bytes'] / MIB:.1f} | "
                             f"{row['predicted_peak_bytes'] / MIB:.1f} | {row['swaps']} | {optimize_s} | "
                             f"{row['images_per_s']:.1f} |")
    if report["table_b"]:
        lines += ["", f"Table 1(b): measured peak at batch {args['depth_batch']}, {args['depth_image_size']}x"
                      f"{args['depth_image_size']}, emulated device {args['depth_budget_mb']} MB "
                      "(predicted in parentheses)",
                  "| network | baseline (MB) | seqmem (MB) | swaps | seqmem's lowest, M_opt (MB) | swaps |",
                  "|---|---:|---:|---:|---:|---:|"]
        for row in report["table_b"]:
            smallest = row.get("smallest", {"error": "not measured"})
            lines.append(f"| ResNet-{row['depth']} | {_peak(row['baseline'])} | {_peak(row['seqmem'])} "
                         f"| {row['seqmem'].get('swaps', '-')} | {_peak(smallest)} | {smallest.get('swaps', '-')} |")
    return "\n".join(lines).strip("\n")


def _format_table_a(report: dict[str, Any]) -> list[str]:
    """Table 1(a) lines: batches, the graph bound, notes, and the measurements at B_base and B_opt."""
    args, table_a = report["args"], report["table_a"]
    base = table_a.get("baseline", {}).get("batch", "-")
    limit = table_a["limit"].get("batch", "-")
    searched = [v for v in VARIANTS[1:] if v in table_a]
    lines = [f"Table 1(a): ResNet-{args['depth']}, {args['image_size']}x{args['image_size']}, {args['classes']} classes, "
             f"emulated device {args['budget_mb']} MB{_host_limit(args)} "
             f"(largest batch that {search_settings(args)})",
             "| variant | largest batch | / B_base | / B_limit |", "|---|---:|---:|---:|",
             f"| baseline (B_base) | {base} | 1.00x | {ratio(base, limit)} |"]
    for variant in searched:
        batch = table_a[variant].get("batch", "-")
        lines.append(f"| {variant} | {batch} | {ratio(batch, base)} | {ratio(batch, limit)} |")
    lines.append(f"| graph bound (B_limit) | {limit} | {ratio(limit, base)} | 1.00x |")
    if table_a["limit"].get("op"):
        lines.append(f"B_limit is set by `{table_a['limit']['op']}` (graph bound, not measured)")
    for variant in VARIANTS:
        for note in table_a.get(variant, {}).get("notes", ()):
            lines.append(f"note ({variant}): {note}")
    if report["at_base"]:
        opt = table_a.get("seqmem", {}).get("batch")
        lines += ["", f"At B_base = {base}, in an arena of twice the budget (measured peak: max of 3 steps; "
                      "throughput: median step); seqmem at B_opt under the budget:",
                  "| variant | measured peak (MB) | predicted peak (MB) | conserved | images/s | vs baseline |",
                  "|---|---:|---:|---:|---:|---:|"]
        reference = report["at_base"]["baseline"].get("images_per_s")
        rows = list(report["at_base"].items())
        rows += [(f"seqmem at B_opt = {opt}", report["at_opt"]["seqmem"])] if report["at_opt"] else []
        for name, row in rows:
            lines.append(_measured_row(name, row, reference))
        if report.get("at_common"):
            common = report["at_common"]
            lines += ["", f"At batch {common['batch']}, the largest every seqmem variant trains, under the budget "
                          "(vs baseline: its images/s at B_base):",
                      "| variant | measured peak (MB) | predicted peak (MB) | conserved | images/s | vs baseline |",
                      "|---|---:|---:|---:|---:|---:|"]
            for name, row in common["rows"].items():
                lines.append(_measured_row(name, row, reference))
    return lines


def _host_limit(args: dict[str, Any]) -> str:
    """How much host memory the swaps had, where the run limited it."""
    host = args.get("host_memory_mb")
    return "" if host is None else f", swaps within {host:g} MB of host memory"


def _measured_row(name: str, row: dict[str, Any], reference: float | None) -> str:
    if "error" in row:
        return f"| {name} | {row['error']} | - | - | - | - |"
    speed = row["images_per_s"]
    return (f"| {name} | {row['peak_bytes'] / MIB:.0f} | {row['predicted_peak_bytes'] / MIB:.0f} | {row['swaps']} "
            f"| {speed:.1f} | {ratio(speed, reference)} |")


def _peak(row: dict[str, Any]) -> str:
    if "error" in row:
        return "OOM" if row["error"] == "oom" else row["error"]
    return f"{row['peak_bytes'] / MIB:.0f} ({row['predicted_peak_bytes'] / MIB:.0f})"


if __name__ == "__main__":
    sys.exit(main())
