"""A benchmark's training step, run in fresh emulated-device processes: does it train, what does it measure.

Both benchmarks (`models/resnet`, `models/nmt`) describe each variant as a
`Workload`; `trains` is the probe their batch searches run, `measure` the
peak and step time at a given batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from seqmem.decisions.plan import DEFAULT_SAFETY_MARGIN
from seqmem.units import MIB

__all__ = ["Runnable", "Workload", "measure", "measure_smallest", "predicted_batch", "runnable", "trains"]


@dataclass(frozen=True)
class Workload:
    """One benchmark variant.

    build: a module-level function `build(batch, **options)` returning (step,
    inputs, input specs): a tf.function training step that returns its loss,
    concrete inputs, and their TensorSpecs.
    options: keyword arguments of `build`, as (name, value) pairs.
    optimized: run the step through `seqmem.optimize` for `budget_mb` (MiB),
    with `safety_margin`, conserving tensors by `kinds` (with `compression`
    for the lossy ones), swaps within `host_memory_mb` MiB (see `optimize`).
    """

    build: Callable[..., tuple[Any, Any, Any]]
    options: tuple[tuple[str, Any], ...]
    optimized: bool
    budget_mb: int
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    kinds: tuple[str, ...] = ("swap",)
    compression: Optional[str] = None
    host_memory_mb: Optional[float] = None


@dataclass(frozen=True)
class Runnable:
    """A workload's step at one batch, callable on `inputs`.

    predicted_peak_bytes: seqmem's prediction (None unless asked for);
    swaps: tensors the plan conserves (any kind) and loop accumulators it swaps (0 for unoptimized steps).
    """

    step: Any
    inputs: Any
    predicted_peak_bytes: Optional[int]
    swaps: int


def runnable(workload: Workload, batch: int, predict: bool = False) -> Runnable:
    """Build the workload's step at `batch`; optimized ones are planned and calibrated for the budget.

    predict: also predict an unoptimized step's peak, as `optimize` would (kernels' scratch measured).
    Raises InfeasibleBudgetError when seqmem finds no plan.
    """
    step, inputs, specs = workload.build(batch, **dict(workload.options))
    if workload.optimized:
        from seqmem.runtime.optimize import optimize

        optimized = optimize(step, workload.budget_mb, input_signature=specs, sample_inputs=inputs,
                             safety_margin=workload.safety_margin, kinds=workload.kinds,
                             compression=workload.compression, host_memory_mb=workload.host_memory_mb)
        return _optimized(optimized, inputs)
    predicted = None
    if predict:
        from seqmem.runtime.step_analysis import predicted_peak_bytes

        predicted = predicted_peak_bytes(step.get_concrete_function(*specs), measure_scratch=True)
    return Runnable(step, inputs, predicted, 0)


def _optimized(step: Any, inputs: Any) -> Runnable:
    """An OptimizedStep as a Runnable: its plan's prediction, and what the plan conserves or swaps."""
    plan = step.plan
    return Runnable(step, inputs, plan.predicted_peak_after_bytes, len(plan.decisions) + len(plan.loop_swaps))


def trains(batch: int, workload: Workload) -> bool:
    """Child process: True if two full training steps run and give finite losses. Raises
    InfeasibleBudgetError when seqmem finds no plan (a batch search notes the probe with the error's reason:
    the smallest peak a plan reaches and the op it peaks at, or the host-memory limit)."""
    built = runnable(workload, batch)
    return all(math.isfinite(float(built.step(*built.inputs))) for _ in range(2))


def measure(batch: int, workload: Workload, steps: int = 3) -> dict[str, Any]:
    """Child process: the highest measured peak (bytes) and the median seconds of `steps` steps after a
    warm-up, the predicted peak, the number of swaps, and `build_s`: seconds building the step took
    (`seqmem.optimize`, calibration included, for an optimized workload; the prediction otherwise)."""
    started = time.perf_counter()
    built = runnable(workload, batch, predict=True)
    return {**_measured(built, steps), "build_s": time.perf_counter() - started}


def _measured(built: Runnable, steps: int) -> dict[str, Any]:
    from seqmem.runtime.measure import timed_steps

    peaks, seconds = timed_steps(built.step, built.inputs, steps)
    return {"peak_bytes": max(peaks), "median_step_s": sorted(seconds)[len(seconds) // 2],
            "predicted_peak_bytes": built.predicted_peak_bytes, "swaps": built.swaps}


def measure_smallest(batch: int, workload: Workload, steps: int = 3) -> dict[str, Any]:
    """Child process: the paper's M_opt, the lowest peak seqmem reaches at `batch`: the workload's step
    optimized (its kinds) for the smallest peak any plan is predicted to reach, as `optimize` reports it for
    a budget no plan fits, then measured as `measure` does. The plan is not calibrated (its target is the
    lowest there is): run this in an arena with room above it. Returns `measure`'s fields plus
    `target_bytes`, the smallest predicted peak planned for."""
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime.optimize import optimize

    step, inputs, specs = workload.build(batch, **dict(workload.options))
    options = {"input_signature": specs, "sample_inputs": inputs, "kinds": workload.kinds,
               "compression": workload.compression, "host_memory_mb": workload.host_memory_mb, "safety_margin": 0.0,
               "calibrate": False}
    try:
        optimized = optimize(step, 1, **options)  # 1 MiB: a budget no training step fits
    except InfeasibleBudgetError as error:
        if error.smallest_peak_bytes is None:
            raise
        optimized = optimize(step, error.smallest_peak_bytes / MIB, **options)
    return {**_measured(_optimized(optimized, inputs), steps), "target_bytes": optimized.plan.target_bytes}


def predicted_batch(workload: Workload, budget_mb: int) -> int:
    """Child process: the batch at which seqmem predicts the unoptimized step's peak reaches `budget_mb`
    (predicted peaks at batch 1 and 2, extrapolated linearly): where a search for B_base can start."""
    from seqmem.bench.batch_search import extrapolated_batch
    from seqmem.runtime.step_analysis import predicted_peak_bytes

    peaks = []
    for batch in (1, 2):
        step, _, specs = workload.build(batch, **dict(workload.options))
        peaks.append(predicted_peak_bytes(step.get_concrete_function(*specs)))
    return extrapolated_batch(peaks[0], peaks[1], budget_mb << 20)
