"""`seqmem.profile`: predict (and, on a measuring device, measure) a training step's memory.

profile = capture -> anatomy -> costs -> timing -> schedule -> simulate, plus an
optional measured run. The measured run restores every variable the step
captured, so profiling does not train the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import tensorflow as tf

from seqmem.analyze.anatomy import StepAnatomy
from seqmem.analyze.critical_path import MachineModel, Timing
from seqmem.edge import capture
from seqmem.errors import UnknownShapeError
from seqmem.ir.graph import Graph, TensorRef
from seqmem.plot import plot_memory_curves
from seqmem.runtime import device
from seqmem.runtime.measure import captured_variables, inputs_like, spec_of, step_peaks, variables_restored
from seqmem.runtime.step_analysis import analyze_function, inter_op_threads
from seqmem.sim.simulator import simulate
from seqmem.sim.trace import MemoryTrace
from seqmem.units import MIB

__all__ = ["FeatureMap", "MeasuredPeak", "Profile", "measure_step_peak", "profile"]



@dataclass(frozen=True)
class FeatureMap:
    """A forward tensor kept for the backward pass.

    lifetime_s: estimated seconds from its producer's completion to the start of
    its last backward reader.
    """

    tensor: TensorRef
    size_bytes: int
    lifetime_s: float


@dataclass(frozen=True)
class Profile:
    """What `profile` found. All sizes in bytes, all times in seconds.

    measured: the device's peak over measured steps (None when not measured);
    it counts everything in device memory, parameters and inputs included, as
    `predicted_peak_bytes` does.
    """

    graph: Graph
    anatomy: StepAnatomy
    timing: Timing
    memory: MemoryTrace
    feature_maps: tuple[FeatureMap, ...]
    predicted_peak_bytes: int
    measured: MeasuredPeak | None = None

    @property
    def measured_peak_bytes(self) -> int | None:
        """Median measured peak in bytes, or None when not measured."""
        return self.measured.median_bytes if self.measured else None

    @property
    def prediction_error(self) -> float | None:
        """(predicted - measured) / measured, or None when not measured."""
        if not self.measured_peak_bytes:
            return None
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    def summary(self, top: int = 8) -> str:
        """A short human-readable report."""
        busiest = self.memory.busiest()
        lines = [
            f"graph: {len(self.graph)} nodes, {len(self.anatomy.forward)} forward, "
            f"{len(self.anatomy.backward)} backward; loss {', '.join(map(str, self.anatomy.losses))}",
            f"persistent memory: {busiest.persistent_bytes / MIB:.1f} MB",
            f"predicted peak:    {self.predicted_peak_bytes / MIB:.1f} MB "
            f"(while running {self.memory.order[busiest.peak_step]!r})",
        ]
        if self.measured is not None:
            lines.append(
                f"measured peak:     {self.measured.median_bytes / MIB:.1f} MB on {self.measured.device}, median of "
                f"{self.measured.steps} steps (range {self.measured.min_bytes / MIB:.1f}-{self.measured.max_bytes / MIB:.1f}); "
                f"prediction error {100 * self.prediction_error:+.1f}%"
            )
        if self.memory.unknown_size:
            lines.append(f"tensors of unknown size (counted as 0): {len(self.memory.unknown_size)}")
        lines.append(f"feature maps: {len(self.feature_maps)}, "
                     f"{sum(f.size_bytes for f in self.feature_maps) / MIB:.1f} MB; largest:")
        for fmap in self.feature_maps[:top]:
            lines.append(f"  {fmap.size_bytes / MIB:8.2f} MB  lives {1e3 * fmap.lifetime_s:8.3f} ms  {fmap.tensor}")
        return "\n".join(lines)

    def plot(self, path: str, title: Optional[str] = None) -> str:
        """Write a PNG of predicted live memory over the step (forward rising, backward falling), with the
        measured peak when there is one. The file appears whole or not at all. Returns `path`."""
        measured = None
        if self.measured is not None:
            measured = (f"measured peak, median of {self.measured.steps} steps ({self.measured.device})",
                        self.measured.median_bytes)
        return plot_memory_curves(path, [("predicted live memory", self.memory, self.timing.cost_s)],
                                  title=title or "memory over one training step",
                                  loss_nodes=[ref.node for ref in self.anatomy.losses],
                                  measured=measured)


def profile(
    step: Any,
    *inputs: Any,
    loss: str | TensorRef | None = None,
    costs: str = "static",
    machine: MachineModel = MachineModel(),
    measure: bool | None = None,
    allocator: str = "bfc",
    measured_steps: int = 5,
) -> Profile:
    """Predict the memory curve of one call of `step` and, if possible, measure its peak.

    step: a tf.function or ConcreteFunction of a training step.
    inputs: its arguments, as tensors or fully-shaped tf.TensorSpecs (nested as the
    step takes them); may be empty if the function has an input signature.
    loss: the loss tensor's name, when it cannot be found automatically.
    costs: "static" (from shapes) or "measured" (a profiled run; needs to run the step).
    measure: run the step and read the device's peak; default: when a measuring
    device (a GPU or the emulated device) is configured.
    Where it runs the step (measure, or measured costs) on one inter-op thread, the
    predicted curve follows the order the step was seen running in
    (`StepAnalysis.as_ran`); otherwise the executor model's order.
    allocator: "bfc" predicts the bytes TensorFlow's BFC allocator reports
    (chunks, fragmentation included); "exact" counts tensor bytes only.
    measured_steps: steps whose peaks are measured (the median is reported).
    Raises TypeError for an unsupported `step`, UnknownShapeError for inputs of
    unknown shape, NoBackwardPassError when the step computes no gradients.
    """
    if costs not in ("static", "measured"):
        raise ValueError(f"costs must be 'static' or 'measured', got {costs!r}")
    if not (isinstance(step, capture.ConcreteFunction) or hasattr(step, "get_concrete_function")):
        raise TypeError(
            f"profile() takes a tf.function or a ConcreteFunction, got {type(step).__name__}; "
            "for a tf.Graph or GraphDef use seqmem.capture.from_tf and the analysis modules"
        )
    specs = tf.nest.map_structure(spec_of, inputs)
    for spec in tf.nest.flatten(specs):
        if not spec.shape.is_fully_defined():
            raise UnknownShapeError(
                f"input spec {spec} has unknown dimensions; pass fully-shaped tf.TensorSpecs "
                "(or tensors) so tensor sizes are known"
            )
    function = capture.concrete_function(step, specs)
    if measure is None:
        measure = device.measuring_device_present()
    args = inputs_like(inputs) if (measure or costs == "measured") else None
    run = step if not isinstance(step, capture.ConcreteFunction) else function
    ran = None
    if args is not None:
        from seqmem.edge.op_trace import trace_ops

        with variables_restored(captured_variables(function)):
            ran = trace_ops(run, args)
    analysis = analyze_function(function, loss=loss, machine=machine, measure_scratch=measure,
                                op_time_s=ran.seconds if costs == "measured" else None,
                                count_loops=args is not None, sample_inputs=args)
    if ran is not None and inter_op_threads() == 1:
        analysis = analysis.as_ran(ran.started)
    graph, anatomy, timing = analysis.graph, analysis.anatomy, analysis.timing
    trace = simulate(graph, analysis.order, allocator=allocator, **analysis.simulator_options())
    measured = measure_step_peak(run, args, function, measured_steps) if measure else None
    return Profile(
        graph=graph,
        anatomy=anatomy,
        timing=timing,
        memory=trace,
        feature_maps=_feature_maps(graph, anatomy, timing),
        predicted_peak_bytes=trace.peak_bytes,
        measured=measured,
    )


@dataclass(frozen=True)
class MeasuredPeak:
    """Peak device bytes of one step over `steps` measured steps: median, lowest, highest.

    The peak varies between steps even in one order: TensorFlow's BFC allocator
    hands a free chunk out whole when it is under twice the request, so the
    bytes it counts depend on where a step's buffers fall among the chunks
    earlier ones left. With more than one inter-op thread the order varies too.
    """

    device: str
    median_bytes: int
    min_bytes: int
    max_bytes: int
    steps: int


def measure_step_peak(run: Any, args: Any, function: capture.ConcreteFunction, steps: int = 5) -> MeasuredPeak:
    """Peak device bytes of each of `steps` calls of `run(*args)`, after one warm-up call.

    Every variable `function` captures is restored afterwards, also on error.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    peaks = sorted(step_peaks(run, args, captured_variables(function), steps, warm_up=True))
    return MeasuredPeak(device.memory_device(), peaks[len(peaks) // 2], peaks[0], peaks[-1], steps)


def _feature_maps(graph: Graph, anatomy: StepAnatomy, timing: Timing) -> tuple[FeatureMap, ...]:
    maps = []
    for ref in anatomy.feature_maps:
        size = graph.tensor(ref).size_bytes
        if not size:
            continue
        last_read = max(timing.start_s[r] for r in graph.consumers(ref) if r in anatomy.backward)
        maps.append(FeatureMap(ref, size, max(0.0, last_read - timing.completion_s[ref.node])))
    maps.sort(key=lambda f: (-f.size_bytes, f.tensor))
    return tuple(maps)
