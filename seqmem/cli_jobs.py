"""What the `seqmem` command line runs in fresh emulated-device processes (module-level, so it pickles).

Each job imports TensorFlow itself; the command line that starts it does not.
"""

from __future__ import annotations

from typing import Any, Optional

from seqmem.swap.plan import ConservationOptions

__all__ = ["example_step", "model_step", "plan_step", "profile_step"]


def example_step(batch: int, name: str) -> tuple[Any, Any, Any]:
    """(step, inputs, input specs) of the built-in example `name` at `batch`: a `bench.workload` builder."""
    from seqmem.examples.steps import build_example

    built = build_example(name, batch)
    return built.step, built.make_inputs(0), built.input_specs


def model_step(batch: int, source: str) -> tuple[Any, Any, Any]:
    """(step, inputs, input specs) of a model source ("example:NAME", or the path of a saved, compiled
    .keras model) at `batch`: a `bench.workload` builder."""
    if source.startswith("example:"):
        return example_step(batch, source.partition(":")[2])
    from seqmem.runtime.keras import saved_model_step

    return saved_model_step(batch, source)


def profile_step(source: str, batch: int, png_path: Optional[str]) -> str:
    """Profile the step of `source` at `batch` (predicted and measured peak); returns the summary."""
    from seqmem.runtime.profile import profile

    step, inputs, _ = model_step(batch, source)
    result = profile(step, *inputs)
    if png_path:
        result.plot(png_path, title=f"batch {batch}: predicted live memory over one step")
    return result.summary()


def plan_step(source: str, batch: int, budget_mb: float, json_path: Optional[str], png_path: Optional[str],
              safety_margin: float = 0.2, options: Optional[ConservationOptions] = None,
              host_memory_mb: Optional[float] = None) -> tuple[int, str]:
    """Optimize the step of `source` at `batch` for `budget_mb` MiB (calibrated on this device; conserving
    tensors as `options` allow, default: swap; swaps within `host_memory_mb` MiB, see `optimize`) and train
    two steps with it; returns (the measured peak bytes of those steps, the plan's summary)."""
    from seqmem.files import write_text
    from seqmem.plot import plot_plan
    from seqmem.runtime import device
    from seqmem.runtime.optimize import optimize

    step, inputs, specs = model_step(batch, source)
    options = options or ConservationOptions()
    optimized = optimize(step, budget_mb, input_signature=specs, sample_inputs=inputs, safety_margin=safety_margin,
                         kinds=options.kinds, compression=options.compression, host_memory_mb=host_memory_mb)
    device.reset_peak()
    for _ in range(2):
        float(optimized(*inputs))
    trained_peak = device.memory_stats().peak_bytes
    if json_path:
        write_text(optimized.plan.to_json(), json_path)
    if png_path:
        plot_plan(png_path, optimized.analysis, optimized.plan, title=f"batch {batch} under {budget_mb} MB")
    return trained_peak, optimized.plan.summary()
