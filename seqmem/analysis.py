"""The analysis pipeline shared by `profile` and `optimize`.

capture -> anatomy -> costs -> timing -> schedule -> scratch memory, for one
ConcreteFunction. The result is plain data; nothing here runs the step.
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping
from dataclasses import dataclass

import tensorflow as tf

from seqmem import capture, device
from seqmem.anatomy import StepAnatomy, analyze_step
from seqmem.critical_path import MachineModel, Timing, analyze_timing, measured_costs, static_costs
from seqmem.gc_pause import gc_paused
from seqmem.graph import Graph, TensorRef
from seqmem.memory import schedule, simulate
from seqmem.workspace import static_scratch_bytes, with_concurrent_scratch

__all__ = ["StepAnalysis", "analyze", "measuring_device_present", "predicted_peak_bytes"]


@dataclass(frozen=True)
class StepAnalysis:
    """A training step's graph, its parts, timing, schedule and per-node scratch bytes."""

    graph: Graph
    anatomy: StepAnatomy
    timing: Timing
    order: tuple[str, ...]
    scratch_bytes: Mapping[str, int]


def measuring_device_present() -> bool:
    """Whether this process can measure device memory (the emulated device or a GPU)."""
    return device.emulated_budget_mb() is not None or bool(tf.config.list_logical_devices("GPU"))


def analyze(
    function: Any,
    *,
    loss: str | TensorRef | None = None,
    machine: MachineModel = MachineModel(),
    op_time_s: Mapping[str, float] | None = None,
    measure_scratch: bool = False,
) -> StepAnalysis:
    """Analyze the training step `function` (a ConcreteFunction, or any target `capture.from_tf` takes).

    op_time_s: measured seconds per node (from `op_trace.trace_op_times`); static costs otherwise.
    measure_scratch: probe kernels' scratch memory on the measuring device.
    """
    with gc_paused():  # pure Python over a large graph; the probes below run TensorFlow with it on
        graph = capture.from_tf(function)
        anatomy = analyze_step(graph, loss)
        cost_s = static_costs(graph, machine)
        if op_time_s is not None:
            cost_s = measured_costs(graph, op_time_s, cost_s)
        timing = analyze_timing(graph, cost_s, anatomy.loss.node)
        scratch = static_scratch_bytes(graph)
    if measure_scratch:
        from seqmem.workspace_probe import measure_workspaces

        scratch.update(measure_workspaces(graph))
    scratch = with_concurrent_scratch(scratch, timing, _inter_op_threads())
    return StepAnalysis(graph, anatomy, timing, schedule(graph, timing), scratch)


def _inter_op_threads() -> int:
    """Ops TensorFlow's executor may run at once here (its inter-op pool, at least 1)."""
    threads = tf.config.threading.get_inter_op_parallelism_threads()
    return threads if threads > 0 else max(1, os.cpu_count() or 1)


def predicted_peak_bytes(function: Any, *, measure_scratch: bool = False) -> int:
    """seqmem's predicted peak device bytes (BFC allocator model) of one call of the unoptimized `function`.

    measure_scratch: probe kernels' scratch memory on the measuring device, as `optimize` does.
    """
    analysis = analyze(function, measure_scratch=measure_scratch)
    return simulate(analysis.graph, analysis.order, allocator="bfc", scratch_bytes=analysis.scratch_bytes).peak_bytes
