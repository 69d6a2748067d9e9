"""`seqmem.optimize`: make a training step fit a memory budget by conserving feature maps.

Three parts: plan (`seqmem.runtime.forms`: `seqmem.plan.choose_conservations` for a
target below the budget, for each form the step may take, as it is or with its
vocabulary heads blocked, the cheapest fitting plan taken), build the runnable step
(`seqmem.runtime.optimized_step`), and on a measuring device calibrate: run the
step, and plan again for less when its measured peak exceeds the budget.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem.analyze.analysis import StepAnalysis
from seqmem.analyze.anatomy import LossNames
from seqmem.analyze.critical_path import EMULATED_DEVICE, MachineModel
from seqmem.edge import capture, loops
from seqmem.edge.swap_nodes import EmulatedDeviceBackend, HostDeviceBackend
from seqmem.errors import InfeasibleBudgetError
from seqmem.runtime import device, stall_watch
from seqmem.runtime.forms import Arena, Forms, forms_of
from seqmem.runtime.measure import captured_variables, inputs_like, spec_of, step_peaks
from seqmem.runtime.optimized_step import OptimizedStep, build_step
from seqmem.runtime.step_analysis import analyze_function
from seqmem.runtime.workers import ABORT_MARK, Workers, failure_line, workers_of
from seqmem.decisions.plan import DEFAULT_SAFETY_MARGIN, ConservationOptions, Plan
from seqmem.rewrite.conservations import SwapBackend
from seqmem.units import MIB

__all__ = ["OptimizedStep", "optimize"]

_CALIBRATION_ROUNDS = 3
_CALIBRATION_CALLS = 4
_DEFAULT_HOST_SHARE = 0.75  # of the host's available memory: the rest for the process and the machine


def optimize(
    target: Any,
    memory_budget_mb: float = 12000,
    *,
    loss: LossNames = None,
    input_signature: Any = None,
    machine: Optional[MachineModel] = None,
    backend: Optional[SwapBackend] = None,
    kinds: Sequence[str] = ("swap",),
    compression: Optional[str] = None,
    min_swap_bytes: int = 64 << 10,
    min_slack_s: float = 0.0,
    max_decisions: Optional[int] = None,
    host_memory_mb: Optional[float] = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    calibrate: bool = True,
    sample_inputs: Any = None,
    pin_order: bool = True,
    loop_parallel_iterations: Optional[int] = 1,
) -> OptimizedStep:
    """Rewrite a training step so that its peak fits `memory_budget_mb` MiB; the result computes what the
    original computes (bit for bit, random ops included, for "swap" and "recompute").

    target: a tf.function (traced for `input_signature`, default the specs of `sample_inputs`), a
    ConcreteFunction, a TF1 tf.Graph or a GraphDef. Returns an OptimizedStep: callable like the original for
    functions, with `.graph_def` and `.plan`.
    loss: the loss tensor, or several, where the gradient seeds do not name them (`seqmem.analyze.anatomy`).
    kinds: how a tensor may be conserved (`seqmem.decisions.plan.KINDS`): "swap" to host memory, "recompute",
    with `compression` ("float16" / "bfloat16") "compress" and "compress+swap", the cheapest that helps per
    tensor; "blocked-head" also plans the step with each vocabulary head computed a block of rows at a time
    (`seqmem.rewrite.vocabulary_head`) and takes the cheaper fitting plan. Compression changes the numbers;
    "blocked-head" sums the head's weight gradients block by block (equal up to float rounding).
    machine, backend: the cost model's constants and the nodes a swap is made of (defaults: the emulated
    device's where no GPU is visible, else `MachineModel()` and host copies).
    min_swap_bytes, min_slack_s, max_decisions: see `ConservationOptions`.
    host_memory_mb: the most host memory the swaps may hold, MiB (default: three quarters of what the host
    has available; `float("inf")`: no limit); a plan that needs more raises InfeasibleBudgetError.
    safety_margin: the plan aims at (1 - safety_margin) x the budget; where no plan reaches that but
    calibration can run, the most-conserving plan predicted to fit the budget is measured.
    calibrate: on a measuring device, run the step `_CALIBRATION_CALLS` times on `sample_inputs` (variables
    restored) and plan again for less, up to `_CALIBRATION_ROUNDS` times, while its peak exceeds the
    budget; the measured peak is recorded in the plan. A later call that runs out of memory before any
    variable update re-plans for 10% less once and runs again (`OptimizedStep`).
    sample_inputs: the arguments to calibrate with and to count data-dependent loop trips (default:
    synthetic, `seqmem.runtime.measure.inputs_like`): real ones where the step checks its inputs' values.
    On a measuring device they are on the device while the step is analyzed and calibrated (NumPy arrays
    copied there first), so the plan counts the inputs a call holds.
    pin_order: on one compute stream, pin the step to the order its plan was simulated in (`seqmem.rewrite.pin`).
    loop_parallel_iterations: run every while loop at most this many iterations at once (None: as traced);
    bounded loops on the emulated device may swap what they save for their gradient
    (`seqmem.edge.loop_swap`).
    A step issuing collectives (`tf.distribute`) is optimized inside `strategy.scope()` on every worker:
    the workers plan from the highest of their measurements, check that their plans agree, and abort each
    other's collectives when one runs out of memory (`seqmem.runtime.workers`); it is not re-planned at call
    time.
    Raises ValueError for a budget or host memory that is not a positive number, a margin outside [0, 1), a
    loop bound that is not a positive int, options `ConservationOptions` refuses or collectives outside a
    strategy's scope; TypeError for another target; InfeasibleBudgetError when no plan fits (with the lowest
    measured peak, if any); WorkersDisagreeError when workers planned differently.
    """
    if not 0 <= safety_margin < 1:
        raise ValueError(f"safety_margin must be in [0, 1), got {safety_margin!r}")
    budget_bytes = int(device.check_budget_mb(memory_budget_mb, "memory_budget_mb") * MIB)
    options = ConservationOptions(kinds, compression, min_swap_bytes, min_slack_s, max_decisions,
                                  _host_limit_bytes(host_memory_mb))
    target_bytes = int(budget_bytes * (1 - safety_margin))
    if loop_parallel_iterations is not None:
        loops.check_parallel_iterations(loop_parallel_iterations)
    backend = backend or _default_backend()
    machine = machine or _default_machine(backend)
    forms = functools.partial(forms_of, budget_bytes=budget_bytes, machine=machine, options=options,
                              loop_parallel_iterations=loop_parallel_iterations,
                              loop_swap_depth=_loop_swap_depth(backend, loop_parallel_iterations))
    if isinstance(target, (tf.Graph, graph_pb2.GraphDef)):
        planner = forms(analyze_function(target, loss=loss, machine=machine), measurable=False, pinned=False)
        plan = planner.plan(target_bytes, Arena(None))[0].fitting_plan()
        return build_step(planner.analysis_of(plan), plan, backend)
    return _optimized_function(*_traced(target, input_signature, sample_inputs), forms, target_bytes, loss=loss,
                               machine=machine, backend=backend, calibrate=calibrate, sample_inputs=sample_inputs,
                               pin_order=pin_order)


def _frames_cleared_on_error(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, its failed frames' locals dropped before its exception propagates: they hold device memory
    (the inputs placed there, a step calibration measured), which a caller keeping the error, as one retrying
    for the smallest peak it reports does, must not keep too."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            traceback.clear_frames(error.__traceback__)
            raise

    return call


@_frames_cleared_on_error
def _optimized_function(function: capture.ConcreteFunction, original: Any, forms: Callable[..., Forms],
                        target_bytes: int, *, loss: LossNames, machine: MachineModel,
                        backend: SwapBackend, calibrate: bool, sample_inputs: Any, pin_order: bool) -> OptimizedStep:
    """`optimize` for a function: analyze it (measuring the device where there is one), plan in the forms
    `forms` makes of the analysis, build the step and calibrate it."""
    workers = workers_of(function.graph.as_graph_def())
    measuring = device.measuring_device_present()
    calibrating = calibrate and measuring
    if measuring:  # on the device before the analysis measures what is in use there, as a call's inputs are
        sample_inputs = inputs_like(function.structured_input_signature[0] if sample_inputs is None
                                    else tuple(sample_inputs))
    analysis = analyze_function(function, loss=loss, machine=machine, measure_scratch=measuring,
                                count_loops=measuring or sample_inputs is not None, sample_inputs=sample_inputs)
    if workers is not None:
        analysis = workers.agreed(analysis)
    planner = forms(analysis, measurable=calibrating, pinned=pin_order and bool(analysis.pinned_order))
    arena_mb = device.emulated_budget_mb()
    result, arena = planner.plan(target_bytes, Arena(None if arena_mb is None else arena_mb * MIB))
    plan = result.plan
    # The margin is room for the predictor's error: where no plan leaves all of it, the most-conserving one
    # leaves the most, and calibration measures whether that is enough.
    if not result.fits and (not calibrating or plan is None or plan.predicted_peak_after_bytes > planner.budget_bytes):
        raise result.error()
    built = functools.partial(_built, backend=backend, function=function, original=original, workers=workers)
    if calibrating:  # no reference kept here: calibration frees a step it replaces (see _calibrated)
        step, arena = _calibrated(built(planner.analysis_of(plan), plan), planner, arena, built, sample_inputs)
    else:
        step = built(planner.analysis_of(plan), plan)
    if workers is None:  # several workers re-planning apart would issue their collectives apart
        step.replan = lambda failed_plan: _plan_for_less(planner, arena, failed_plan, measured=None)[0]
    return step


def _traced(target: Any, input_signature: Any, sample_inputs: Any) -> tuple[capture.ConcreteFunction, Any]:
    """The concrete function `optimize` plans for and what the optimized step calls when it needs the
    original (`target` itself unless it is already a ConcreteFunction). Raises TypeError for a target that
    is not a function."""
    if not (isinstance(target, capture.ConcreteFunction) or hasattr(target, "get_concrete_function")):
        raise TypeError(
            f"optimize() takes a tf.function, a ConcreteFunction, a tf.Graph or a GraphDef, got {type(target).__name__}"
        )
    if input_signature is None and sample_inputs is not None:
        input_signature = tf.nest.map_structure(spec_of, tuple(sample_inputs))
    function = capture.concrete_function(target, tuple(input_signature or ()))
    return function, target if not isinstance(target, capture.ConcreteFunction) else function


def _built(analysis: StepAnalysis, plan: Plan, backend: SwapBackend, function: capture.ConcreteFunction,
           original: Any, workers: Optional[Workers]) -> OptimizedStep:
    """`build_step`, once every worker of a distributed step has made the same `plan`."""
    if workers is not None:
        workers.check_same(plan)
    step = build_step(analysis, plan, backend, function, original)
    step.workers = workers
    return step


def _loop_swap_depth(backend: SwapBackend, parallel_iterations: Optional[int]) -> Optional[int]:
    """How many iterations' elements of a swapped loop accumulator may be on the device at once: the loop
    bound; None (no loop swaps) for loops left as traced, and off the emulated device, where the rewrite
    (`seqmem.edge.loop_swap`) has not been verified."""
    return parallel_iterations if isinstance(backend, EmulatedDeviceBackend) else None


def _host_limit_bytes(host_memory_mb: Optional[float]) -> Optional[int]:
    """`optimize`'s host_memory_mb in bytes: the default share of what the host has available, None for no
    limit. Raises ValueError for a value that is not a positive number."""
    if host_memory_mb is None:
        available = device.available_host_bytes()
        return None if available is None else int(available * _DEFAULT_HOST_SHARE)
    if host_memory_mb == float("inf"):
        return None
    return int(device.check_budget_mb(host_memory_mb, "host_memory_mb") * MIB)


def _default_machine(backend: SwapBackend) -> MachineModel:
    return EMULATED_DEVICE if isinstance(backend, EmulatedDeviceBackend) else MachineModel()


def _default_backend() -> SwapBackend:
    if tf.config.list_logical_devices("GPU"):
        return HostDeviceBackend("/device:CPU:0", "/device:GPU:0")
    return EmulatedDeviceBackend()


def _calibrated(step: OptimizedStep, planner: Forms, arena: Arena, built: Callable[[StepAnalysis, Plan], Any],
                sample_inputs: Any) -> tuple[OptimizedStep, Arena]:
    """Measure `step` on the device; while its peak exceeds the budget (or it runs out of memory), plan
    for less by the measured overshoot (`_plan_for_less`) and make its step with `built`, up to
    `_CALIBRATION_ROUNDS` times. Returns the
    first step that fits (its measured peak recorded in the plan, instantiated anew so that its random ops
    draw what the original's first call would), or the last one planned; and the arena to plan in from
    then on."""
    function = step.function
    measured_peaks = []
    for _ in range(_CALIBRATION_ROUNDS):
        measured = _measured_peak(step, function, sample_inputs, planner.budget_bytes)
        if measured is not None and measured <= planner.budget_bytes:
            step.plan = dataclasses.replace(step.plan, measured_peak_bytes=measured)
            step.restart()  # calibration's calls advanced its random kernels
            return step, arena
        if measured is not None:
            measured_peaks.append(measured)
        plan, arena = _plan_for_less(planner, arena, step.plan, measured, min(measured_peaks, default=None))
        step = None
        # A step that ran holds device memory (its functions' constants, folded when TensorFlow instantiated
        # them) until its graph's reference cycles are collected.
        # Left to the collector, it shares the arena with the next plan's step, which then measures high or,
        # instantiated in a full arena, crashes (SIGSEGV in ConstantFold's tensor::DeepCopy).
        gc.collect()
        step = built(planner.analysis_of(plan), plan)
    return step, arena


def _plan_for_less(planner: Forms, arena: Arena, plan: Plan, measured: Optional[int],
                   lowest_measured: Optional[int] = None) -> tuple[Plan, Arena]:
    """The plan to run after `plan` peaked at `measured` bytes on the device (None: it ran out of memory):
    aimed below what `plan` predicted by the overshoot, at least 5% of its target (10% after an OOM); the
    most-conserving plan when no plan reaches that but that one is lower than `plan`'s prediction. With it,
    the arena to plan in from then on (`FormPlanner.plan`).
    Raises InfeasibleBudgetError, with `lowest_measured` bytes, when no plan can aim lower."""
    budget_bytes, target_bytes = planner.budget_bytes, plan.target_bytes
    seen = "ran out of memory" if measured is None else f"peaked at {measured / MIB:.1f} MB"
    overshoot = measured - budget_bytes if measured is not None else target_bytes // 10
    target_bytes = min(target_bytes, plan.predicted_peak_after_bytes) - max(overshoot, target_bytes // 20)
    persistent_bytes = planner.persistent_bytes(arena)
    if target_bytes <= persistent_bytes:
        raise InfeasibleBudgetError(
            f"the optimized step {seen} on the device, over the {budget_bytes / MIB:.1f} MB budget, and no "
            f"plan can aim lower: the step's persistent memory (weights, optimizer slots, inputs, and what "
            f"else the process holds on the device) is "
            f"{persistent_bytes / MIB:.1f} MB. Raise the budget or reduce the batch size.",
            smallest_peak_bytes=plan.predicted_peak_after_bytes, measured_peak_bytes=lowest_measured,
        )
    result, arena = planner.plan(target_bytes, arena)
    if result.fits:
        return result.plan, arena
    lowest = result.plan
    if lowest is None or lowest.predicted_peak_after_bytes >= plan.predicted_peak_after_bytes:
        unplaced = None if measured is not None else arena.unplaced
        foreseen = "" if unplaced is None else (
            f" The bytes fit, their buffers did not (fragmentation), as the allocator model foresaw: {unplaced}.")
        raise InfeasibleBudgetError(
            f"the optimized step {seen} on the device, over the {budget_bytes / MIB:.1f} MB budget, where its "
            f"plan predicted {plan.predicted_peak_after_bytes / MIB:.1f} MB, and no plan is predicted lower: "
            f"{result.reason}{foreseen}",
            smallest_peak_bytes=result.smallest_peak_bytes, measured_peak_bytes=lowest_measured, floor=result.floor,
            unplaced=unplaced,
        )
    return lowest, arena  # the most-conserving plan: its measurement decides


def _measured_peak(step: OptimizedStep, function: capture.ConcreteFunction, sample_inputs: tuple,
                   budget_bytes: int) -> Optional[int]:
    """Highest peak device bytes of `_CALIBRATION_CALLS` calls of `step` on `sample_inputs` (tensors on the
    device), or None if one ran out of memory. A call that does not fit waits in the allocator's retry
    (10 s on the emulated device) before it fails: an idle wait calibration expects.

    For a step of several workers: the highest over every worker (None when any ran out of memory),
    measured first with the step's collectives made local (`OptimizedStep.without_collectives`), then,
    where that fits `budget_bytes` on every worker, with its collectives. A worker that runs out of memory
    then aborts every worker's collectives: InfeasibleBudgetError on every worker."""
    workers = step.workers
    if workers is None:
        return _peak_or_none(step, function, sample_inputs)
    local = step.without_collectives()
    made_local = local is not None
    if made_local:
        measured = workers.highest([_peak_or_none(local, function, sample_inputs)])[0]
        local = None
        gc.collect()  # the local step's folded constants leave the arena before the step runs
        if measured is None or measured > budget_bytes:
            return measured
    try:
        with stall_watch.expected_idle():
            measured = max(step_peaks(step, sample_inputs, captured_variables(function), _CALIBRATION_CALLS))
    except (tf.errors.ResourceExhaustedError, tf.errors.UnavailableError) as error:
        if not (isinstance(error, tf.errors.ResourceExhaustedError) or ABORT_MARK in error.message):
            raise
        # this worker's step aborted every worker's collectives, or another worker's did: none can go on
        where = "on this worker" if isinstance(error, tf.errors.ResourceExhaustedError) else "on another worker"
        fitted = "" if not made_local else ", after it fitted with its collectives made local,"
        raise InfeasibleBudgetError(
            f"the optimized step ran out of memory {where} in calibration, over the "
            f"{step.plan.budget_bytes / MIB:.1f} MB budget{fitted} and the workers' collectives were aborted, "
            f"so no worker can re-plan. Restart every worker with a higher budget or a smaller batch. "
            f"({failure_line(error.message)})") from None
    return workers.highest([measured])[0]


def _peak_or_none(step: OptimizedStep, function: capture.ConcreteFunction, args: Any) -> Optional[int]:
    """Highest peak device bytes of `_CALIBRATION_CALLS` calls of `step`, or None if one ran out of memory."""
    try:
        with stall_watch.expected_idle():
            return max(step_peaks(step, args, captured_variables(function), _CALIBRATION_CALLS))
    except tf.errors.ResourceExhaustedError:
        return None
