"""How long seqmem's planner takes on a ResNet-1001 training graph (static costs, no device).

    python -m models.resnet.planner_speed [--depth 1001] [--batch 32]

Prints the graph size and the seconds of each stage: analysis (capture,
anatomy, timing, schedule), planning (selector + simulations) and rewrite.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=1001)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--budget-fraction", type=float, default=0.6, help="budget as a fraction of the baseline peak")
    args = parser.parse_args(argv)
    if args.batch < 1 or not 0 < args.budget_fraction <= 1:
        parser.error("--batch must be positive and --budget-fraction in (0, 1]")

    from models.resnet.benchmark import training_step
    from seqmem.plan import choose_conservations
    from seqmem.edge.swap_nodes import EmulatedDeviceBackend
    from seqmem.runtime.step_analysis import analyze_function
    from seqmem.sim.simulator import simulate
    from seqmem.rewrite.conservations import rewrite

    started = time.perf_counter()
    step, _, specs = training_step(args.batch, args.depth, image_size=32, classes=10)
    function = step.get_concrete_function(*specs)
    print(f"built and traced ResNet-{args.depth} in {time.perf_counter() - started:.1f} s", flush=True)

    started = time.perf_counter()
    analysis = analyze_function(function)
    analysis_s = time.perf_counter() - started
    # choosing the budget is the benchmark's set-up, not part of optimize: untimed
    baseline = simulate(analysis.graph, analysis.order, allocator="bfc", scratch_bytes=analysis.scratch_bytes)
    budget = int(args.budget_fraction * baseline.peak_bytes)
    started = time.perf_counter()
    plan = choose_conservations(analysis, budget).fitting_plan()
    plan_s = time.perf_counter() - started
    started = time.perf_counter()
    rewrite(analysis.graph, plan, EmulatedDeviceBackend())
    rewrite_s = time.perf_counter() - started
    print(f"graph: {len(analysis.graph)} nodes; predicted peak {baseline.peak_bytes / 2**20:.0f} MB, "
          f"budget {budget / 2**20:.0f} MB -> plan {plan.predicted_peak_after_bytes / 2**20:.0f} MB "
          f"with {len(plan.decisions)} swaps")
    print(f"optimize (analysis + plan + rewrite): {analysis_s + plan_s + rewrite_s:.2f} s "
          f"(analysis {analysis_s:.2f} s, plan {plan_s:.2f} s, rewrite {rewrite_s:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
