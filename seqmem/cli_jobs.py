"""What the `seqmem` command line runs in fresh emulated-device processes (module-level, so it pickles).

Each job imports TensorFlow itself; the command line that starts it does not.
"""

from __future__ import annotations

from typing import Any, Optional

from seqmem.decisions.plan import DEFAULT_SAFETY_MARGIN, ConservationOptions

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


def profile_step(source: str, batch: int, png_path: Optional[str], at_peak: int = 0) -> str:
    """Profile the step of `source` at `batch` (predicted and measured peak); returns the summary, with the
    `at_peak` largest buffers live at the predicted peak and, from the allocator's trace of one more step
    (variables restored), at the measured one."""
    from seqmem.runtime.profile import profile

    step, inputs, specs = model_step(batch, source)
    result = profile(step, *inputs)
    if png_path:
        result.plot(png_path, title=f"batch {batch}: predicted live memory over one step")
    if not at_peak:
        return result.summary()
    from seqmem.edge.allocation_trace import AllocationTrace, trace_allocations
    from seqmem.runtime.measure import captured_variables, variables_restored
    from seqmem.units import MIB

    with variables_restored(captured_variables(step.get_concrete_function(*specs))):
        trace = trace_allocations(step, inputs)
    busiest = result.memory.busiest()
    lines = [result.summary(), f"live at the predicted peak, largest {at_peak} of {len(busiest.live_at_peak)}:"]
    lines += [f"  {size / MIB:8.2f} MB  {tensor}" for tensor, size in busiest.live_at_peak[:at_peak]]
    peak = trace.events[trace.peak_index]
    live = trace.live_after(trace.peak_index)
    lines.append(f"live at the measured peak of one traced step ({peak.in_use_bytes / MIB:.1f} MB in use, "
                 f"{trace.in_use_before_bytes / MIB:.1f} MB before the step), allocated by the step, largest {at_peak} "
                 f"ops of {len(live)} chunks:")
    lines += [f"  {size / MIB:8.2f} MB  {count:5d} chunks  {op or '(unnamed)'}"
              for op, size, count in AllocationTrace.bytes_by_op(live)[:at_peak]]
    return "\n".join(lines)


def plan_step(source: str, batch: int, budget_mb: float, json_path: Optional[str], png_path: Optional[str],
              safety_margin: float = DEFAULT_SAFETY_MARGIN, options: Optional[ConservationOptions] = None,
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
