"""`seqmem.optimize`: make a training step fit a memory budget by swapping feature maps.

analyze (seqmem.analysis) -> plan (seqmem.budget) -> rewrite (seqmem.swap.rewrite)
-> run: the rewritten GraphDef is imported into a `tf.compat.v1.wrap_function`
with the original variable handles mapped in, so variables update in place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem import capture, device
from seqmem.analysis import analyze, measuring_device_present
from seqmem.budget import InfeasibleBudgetError, plan_swaps
from seqmem.critical_path import MachineModel
from seqmem.execution import inputs_like, step_peaks
from seqmem.graph import TensorRef
from seqmem.swap.backends import EmulatedDeviceBackend, HostDeviceBackend
from seqmem.swap.plan import SwapPlan
from seqmem.swap.rewrite import SwapBackend, rewrite

__all__ = ["OptimizedStep", "optimize"]

_MB = 1 << 20
_CALIBRATION_ROUNDS = 3


class OptimizedStep:
    """A training step rewritten to fit a budget; call it like the original.

    graph_def: the rewritten graph. plan: what was swapped and why (see SwapPlan).
    function: the original ConcreteFunction (None for graph targets).
    """

    def __init__(self, plan: SwapPlan, graph_def: graph_pb2.GraphDef, function=None, original=None) -> None:
        self.plan = plan
        self.graph_def = graph_def
        self.function = function
        self._original = original
        self._run = None
        if function is not None:
            self._run = original if not plan.decisions else _executable(function, graph_def)

    def __call__(self, *args: Any) -> Any:
        if self._run is None:
            raise TypeError("this step came from a graph: run .graph_def in a tf.compat.v1.Session")
        try:
            if self._run is self._original:
                return self._run(*args)
            outputs = self._run(*tf.nest.flatten(args))
            return tf.nest.pack_sequence_as(self.function.structured_outputs, outputs)
        except tf.errors.ResourceExhaustedError as error:
            raise type(error)(
                error.node_def, error.op,
                f"{error.message}\nseqmem: the plan predicted a peak of "
                f"{self.plan.predicted_peak_after_bytes / _MB:.1f} MB for a budget of "
                f"{self.plan.budget_bytes / _MB:.1f} MB",
            ) from None


def _default_backend() -> SwapBackend:
    if tf.config.list_logical_devices("GPU"):
        return HostDeviceBackend("/device:CPU:0", "/device:GPU:0")
    return EmulatedDeviceBackend()


def optimize(
    target: Any,
    memory_budget_mb: float = 12000,
    *,
    loss: str | TensorRef | None = None,
    input_signature: Any = None,
    machine: MachineModel = MachineModel(),
    backend: SwapBackend | None = None,
    min_swap_bytes: int = 64 << 10,
    safety_margin: float = 0.2,
    calibrate: bool = True,
    sample_inputs: Any = None,
) -> OptimizedStep:
    """Rewrite a training step so that its peak fits `memory_budget_mb` MiB.

    target: a tf.function (traced for `input_signature`, a sequence of
    TensorSpecs, when it has none of its own), a ConcreteFunction, a TF1
    tf.Graph or a GraphDef. Returns an OptimizedStep: callable like the original
    for functions (unchanged when the step already fits), with `.graph_def` and
    `.plan`.
    safety_margin: the plan aims at (1 - safety_margin) x the budget, room for
    the predictor's error (within about 15%, see README). When no plan reaches
    that but calibration can run, the plan aims at the budget itself and the
    measurement decides.
    calibrate: on a measuring device (emulated or GPU), run the optimized step
    four times on `sample_inputs` (variables restored afterwards); if its highest
    peak exceeds the budget, plan again for less, up to 3 times. The measured
    peak is recorded in the plan. Peaks vary from step to step (TensorFlow's
    executor runs independent ops concurrently), so a later step can still
    exceed what calibration saw; the margin is there for that.
    sample_inputs: the step's arguments to calibrate with (default: synthetic,
    see `seqmem.execution.inputs_like`); pass real ones when the step checks
    its inputs' values.
    Raises ValueError for a budget that is not a positive finite number or a
    margin outside [0, 1), TypeError for another target, InfeasibleBudgetError
    when no swap set fits.
    """
    if not 0 <= safety_margin < 1:
        raise ValueError(f"safety_margin must be in [0, 1), got {safety_margin!r}")
    budget_bytes = int(device.check_budget_mb(memory_budget_mb, "memory_budget_mb") * _MB)
    planned_bytes = int(budget_bytes * (1 - safety_margin))
    backend = backend or _default_backend()
    if isinstance(target, (tf.Graph, graph_pb2.GraphDef)):
        return _optimize_graph(target, planned_bytes, loss, machine, backend, min_swap_bytes)
    if not (isinstance(target, capture.ConcreteFunction) or hasattr(target, "get_concrete_function")):
        raise TypeError(
            f"optimize() takes a tf.function, a ConcreteFunction, a tf.Graph or a GraphDef, got {type(target).__name__}"
        )
    function = capture.concrete_function(target, tuple(input_signature or ()))
    measuring = measuring_device_present()
    arena_mb = device.emulated_budget_mb()
    arena_bytes = None if arena_mb is None else arena_mb * _MB
    analysis = analyze(function, loss=loss, machine=machine, measure_scratch=measuring)
    original = target if not isinstance(target, capture.ConcreteFunction) else function

    calibrating = calibrate and measuring

    def build(target_bytes: int) -> OptimizedStep:
        nonlocal arena_bytes

        def plan_for(arena):
            return plan_swaps(analysis.graph, analysis.anatomy, analysis.timing, analysis.order, target_bytes,
                              machine=machine, scratch_bytes=analysis.scratch_bytes, min_swap_bytes=min_swap_bytes,
                              arena_bytes=arena)

        try:
            plan = plan_for(arena_bytes)
        except InfeasibleBudgetError as error:
            if error.smallest_peak_bytes is not None or arena_bytes is None or not calibrating:
                raise
            # Only the allocator model's fragmentation stood in the way: a model, which calibration
            # checks on the device itself. Plan without it from here on.
            arena_bytes = None
            plan = plan_for(None)
        plan = dataclasses.replace(plan, budget_bytes=budget_bytes)
        return OptimizedStep(plan, capture.to_graph_def(rewrite(analysis.graph, plan, backend)), function, original)

    try:
        step = build(planned_bytes)
    except InfeasibleBudgetError:
        if not calibrating or planned_bytes == budget_bytes:
            raise
        # The margin is room for the predictor's error, and the device can settle what the
        # prediction cannot: plan for the budget itself and let calibration measure it.
        planned_bytes = budget_bytes
        step = build(planned_bytes)
    for _ in range(_CALIBRATION_ROUNDS if calibrating else 0):
        measured = _measured_peak(step, function, sample_inputs)
        if measured is not None and measured <= budget_bytes:
            step.plan = dataclasses.replace(step.plan, measured_peak_bytes=measured)
            break
        # aim below what this plan predicted, by the measured overshoot (at least 5%; 10% after an OOM)
        overshoot = measured - budget_bytes if measured is not None else planned_bytes // 10
        planned_bytes = min(planned_bytes, step.plan.predicted_peak_after_bytes) - max(overshoot, planned_bytes // 20)
        try:
            step = build(planned_bytes)
        except InfeasibleBudgetError as error:
            smallest = error.smallest_peak_bytes
            if smallest is not None and smallest < step.plan.predicted_peak_after_bytes:
                planned_bytes = smallest  # the most-swapping plan: its measurement decides
                step = build(planned_bytes)
                continue
            seen = "ran out of memory" if measured is None else f"peaked at {measured / _MB:.1f} MB"
            raise InfeasibleBudgetError(
                f"the optimized step {seen} on the device, over the {budget_bytes / _MB:.1f} MB budget, and "
                f"planning for less does not fit: {error}",
                smallest_peak_bytes=smallest,
            ) from None
    return step


def _measured_peak(step: OptimizedStep, function: capture.ConcreteFunction, sample_inputs: Any = None,
                   calls: int = 4) -> int | None:
    """Highest peak device bytes of `calls` calls of `step` on `sample_inputs` (default: synthetic),
    or None if one ran out of memory."""
    args = inputs_like(function.structured_input_signature[0]) if sample_inputs is None else sample_inputs
    try:
        return max(step_peaks(step, args, function.graph.variables, calls))
    except tf.errors.ResourceExhaustedError:
        return None


def _optimize_graph(target, budget_bytes, loss, machine, backend, min_swap_bytes) -> OptimizedStep:
    analysis = analyze(target, loss=loss, machine=machine)
    plan = plan_swaps(analysis.graph, analysis.anatomy, analysis.timing, analysis.order, budget_bytes,
                      machine=machine, scratch_bytes=analysis.scratch_bytes, min_swap_bytes=min_swap_bytes)
    return OptimizedStep(plan, capture.to_graph_def(rewrite(analysis.graph, plan, backend)))


def _executable(function: capture.ConcreteFunction, graph_def: graph_pb2.GraphDef):
    """A callable running `graph_def` with `function`'s flat inputs, its captures mapped in."""
    captured = list(function.captured_inputs)
    placeholders = function.graph.inputs
    user_inputs = placeholders[: len(placeholders) - len(captured)]
    capture_names = [t.name for t in placeholders[len(user_inputs):]]
    output_names = [t.name for t in function.graph.outputs]

    def body(*args):
        input_map = {t.name: arg for t, arg in zip(user_inputs, args)}
        graph = tf.compat.v1.get_default_graph()  # the wrap_function's FuncGraph
        input_map.update({name: graph.capture(value) for name, value in zip(capture_names, captured)})
        return tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=output_names,
                                              name="seqmem")

    signature = [tf.TensorSpec(t.shape, t.dtype) for t in user_inputs]
    return tf.compat.v1.wrap_function(body, signature)
