"""`seqmem.optimize`: make a training step fit a memory budget by conserving feature maps.

Three parts: plan (`seqmem.runtime.forms`: `seqmem.plan.choose_conservations` for a
target below the budget, for each form the step may take, as it is or with its
vocabulary heads blocked, the cheapest fitting plan taken), build the runnable step
(`seqmem.runtime.optimized_step`), and on a measuring device calibrate: run the
step, and plan again for less when its measured peak exceeds the budget.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from typing import Any, Optional, Union

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem.analysis import StepAnalysis
from seqmem.critical_path import EMULATED_DEVICE, MachineModel
from seqmem.edge import capture, loops
from seqmem.edge.swap_nodes import EmulatedDeviceBackend, HostDeviceBackend
from seqmem.errors import InfeasibleBudgetError
from seqmem.ir.graph import TensorRef
from seqmem.runtime import device, stall_watch
from seqmem.runtime.forms import Arena, Forms, forms_of
from seqmem.runtime.measure import captured_variables, inputs_like, step_peaks
from seqmem.runtime.optimized_step import OptimizedStep, build_step
from seqmem.runtime.step_analysis import analyze_function
from seqmem.runtime.workers import ABORT_MARK, Workers, failure_line, workers_of
from seqmem.swap.plan import DEFAULT_SAFETY_MARGIN, ConservationOptions, SwapPlan
from seqmem.swap.rewrite import SwapBackend
from seqmem.units import MIB

__all__ = ["OptimizedStep", "optimize"]

_CALIBRATION_ROUNDS = 3
_CALIBRATION_CALLS = 4
_DEFAULT_HOST_SHARE = 0.75  # of the host's available memory: the rest for the process and the machine


def optimize(
    target: Any,
    memory_budget_mb: float = 12000,
    *,
    loss: Union[str, TensorRef, None] = None,
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
    """Rewrite a training step so that its peak fits `memory_budget_mb` MiB.

    target: a tf.function (traced for `input_signature`, a sequence of
    TensorSpecs, when it has none of its own; default: the specs of
    `sample_inputs`), a ConcreteFunction, a TF1
    tf.Graph or a GraphDef. Returns an OptimizedStep: callable like the original
    for functions (unchanged when the step already fits, has no loop to bound
    and is not pinned), with `.graph_def` and `.plan`.
    kinds: how a feature map may be conserved (`seqmem.swap.plan.KINDS`): "swap"
    to host memory, "recompute" from tensors the device keeps anyway, and, only
    with `compression` ("float16" or "bfloat16"), "compress" (cast on the device)
    and "compress+swap"; per tensor the cheapest kind that helps is chosen.
    And "blocked-head": each vocabulary head (a projection to logits, sparse
    softmax cross-entropy and their gradient, `seqmem.swap.vocabulary_head`)
    computed a block of rows at a time, its logits recomputed in backward; the
    step is planned with and without, and the plan that fits at the lower
    predicted cost is taken (the plan lists the heads, and says why a
    cross-entropy was not recognized as one).
    Compression changes the step's numbers, and "blocked-head" sums the head's
    weight gradients block by block (equal up to float rounding); the other
    kinds do not change them.
    machine: the cost model's constants (default: `critical_path.EMULATED_DEVICE`
    with the emulated device's backend, where a swap takes the compute's own
    time, else `MachineModel()`).
    backend: the nodes a swap is made of (default: host copies where a GPU is
    visible, else the emulated device's serialized buffers).
    min_swap_bytes, min_slack_s, max_decisions: leave out tensors smaller than
    this, or living shorter (seconds, producer to first backward reader), and
    conserve at most this many (see `ConservationOptions`).
    host_memory_mb: the most host memory the plan's swaps may hold, MiB
    (`SwapPlan.host_bytes`, an upper bound; default: three quarters of what the
    host has available when `optimize` runs, `device.available_host_bytes`;
    `float("inf")`: no limit). A step whose swaps would need more than the host
    has fails with InfeasibleBudgetError instead of exhausting the machine.
    safety_margin: the plan aims at (1 - safety_margin) x the budget, room for
    the predictor's error. When no plan reaches that but calibration can run,
    the most-conserving plan is made, if it is predicted to fit the budget, and
    the measurement decides.
    calibrate: on a measuring device (emulated or GPU), run the optimized step
    four times on `sample_inputs` (variables restored afterwards); if its highest
    peak exceeds the budget, plan again for less, up to 3 times. The measured
    peak is recorded in the plan. A later call can still run out of memory
    (an arena fragmented by other work, an executor's varying order): when it
    did so before any variable update ran, the step plans for 10% less, once,
    logs one line and runs the call again (see `OptimizedStep`).
    sample_inputs: the step's arguments to calibrate with, and to count the
    iterations of its while loops whose trip count depends on data (a decoder
    run until its sequences end: `seqmem.edge.trip_counts`) (default:
    synthetic, see `seqmem.runtime.measure.inputs_like`); pass real ones when
    the step checks its inputs' values or its loops run as long as they say.
    pin_order: when the step runs on one compute stream (one inter-op thread,
    as on the emulated device), pin it with control edges (`seqmem.swap.pin`)
    to its schedule or to its own order, whichever peaks lower, also when it
    fits as it is, so that it runs in the order the plan was simulated in.
    No effect elsewhere.
    loop_parallel_iterations: every while loop of the step (Keras RNNs, tfa
    decoders, their gradient loops) runs at most this many iterations at once
    (`seqmem.edge.loops`): at 1 a loop's memory no longer depends on how far
    ahead the executor runs it. None keeps the loops as traced. With loops
    bounded, on the emulated device, the plan may also swap what a loop saves
    for its gradient, element by element (`seqmem.edge.loop_swap`).
    A step that issues collectives (`tf.distribute`'s all-reduce across workers)
    is optimized inside `strategy.scope()` on every worker: the workers plan
    from the same measurements (the highest any of them measured), check that
    they made the same plan before it runs, and a worker that runs out of memory
    aborts the others' collectives (`seqmem.runtime.workers`); such a step is
    not re-planned at call time.
    Raises ValueError for a budget that is not a positive finite number, a
    host memory that is not a positive number, a margin outside [0, 1), a loop
    bound that is not a positive int, or options `ConservationOptions` refuses
    (an unknown kind or compression dtype), or collectives outside a strategy's
    scope, TypeError for another target, InfeasibleBudgetError when no swap set
    fits (with the lowest measured peak when calibration measured one; on every
    worker, when one ran out of memory in calibration), WorkersDisagreeError
    when a step's workers planned differently.
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
    loop_swap_depth = _loop_swap_depth(backend, loop_parallel_iterations)
    if isinstance(target, (tf.Graph, graph_pb2.GraphDef)):
        analysis = analyze_function(target, loss=loss, machine=machine)
        forms = forms_of(analysis, budget_bytes, machine, options, measurable=False, pinned=False,
                         loop_parallel_iterations=loop_parallel_iterations, loop_swap_depth=loop_swap_depth)
        plan = forms.plan(target_bytes, Arena(None))[0].fitting_plan()
        return build_step(forms.analysis_of(plan), plan, backend)
    if not (isinstance(target, capture.ConcreteFunction) or hasattr(target, "get_concrete_function")):
        raise TypeError(
            f"optimize() takes a tf.function, a ConcreteFunction, a tf.Graph or a GraphDef, got {type(target).__name__}"
        )
    if input_signature is None and sample_inputs is not None:
        input_signature = tf.nest.map_structure(tf.TensorSpec.from_tensor, tuple(sample_inputs))
    function = capture.concrete_function(target, tuple(input_signature or ()))
    original = target if not isinstance(target, capture.ConcreteFunction) else function
    workers = workers_of(function.graph.as_graph_def())
    measuring = device.measuring_device_present()
    calibrating = calibrate and measuring
    analysis = analyze_function(function, loss=loss, machine=machine, measure_scratch=measuring,
                                count_loops=measuring or sample_inputs is not None, sample_inputs=sample_inputs)
    if workers is not None:
        analysis = _agreed(analysis, workers)
    arena_mb = device.emulated_budget_mb()
    planner = forms_of(analysis, budget_bytes, machine, options, measurable=calibrating,
                       pinned=pin_order and bool(analysis.pinned_order),
                       loop_parallel_iterations=loop_parallel_iterations, loop_swap_depth=loop_swap_depth)
    result, arena = planner.plan(target_bytes, Arena(None if arena_mb is None else arena_mb * MIB))
    plan = result.plan
    if not result.fits and (not calibrating or plan is None or plan.predicted_peak_after_bytes > budget_bytes):
        raise result.error()
    # Where no plan fits: the margin is room for the predictor's error. No plan leaves all of it; the
    # most-conserving one leaves the most, and calibration measures whether that is enough.
    if calibrating:  # no reference kept here: calibration frees a step it replaces (see _calibrated)
        step, arena = _calibrated(_built(planner.analysis_of(plan), plan, backend, function, original, workers),
                                  planner, arena, backend, sample_inputs)
    else:
        step = _built(planner.analysis_of(plan), plan, backend, function, original, workers)
    if workers is None:  # several workers re-planning apart would issue their collectives apart
        step.replan = lambda failed_plan: _plan_for_less(planner, arena, failed_plan, measured=None)[0]
    return step


def _built(analysis: StepAnalysis, plan: SwapPlan, backend: SwapBackend, function: capture.ConcreteFunction,
           original: Any, workers: Optional[Workers]) -> OptimizedStep:
    """`build_step`, once every worker of a distributed step has made the same `plan`."""
    if workers is not None:
        workers.check_same(plan)
    step = build_step(analysis, plan, backend, function, original)
    step.workers = workers
    return step


def _agreed(analysis: StepAnalysis, workers: Workers) -> StepAnalysis:
    """`analysis` with what each worker measures of its own device, the bytes in use before the step, the
    highest of any worker's: the same inputs give every worker the same plan."""
    devices = sorted(analysis.in_use_before_bytes)
    highest = workers.highest([analysis.in_use_before_bytes[name] for name in devices])
    return dataclasses.replace(analysis, in_use_before_bytes=dict(zip(devices, highest)))


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


def _calibrated(step: OptimizedStep, planner: Forms, arena: Arena, backend: SwapBackend,
                sample_inputs: Any) -> tuple[OptimizedStep, Arena]:
    """Measure `step` on the device; while its peak exceeds the budget (or it runs out of memory), plan
    for less by the measured overshoot (`_plan_for_less`), up to `_CALIBRATION_ROUNDS` times. Returns the
    first step that fits (its measured peak recorded in the plan, instantiated anew so that its random ops
    draw what the original's first call would), or the last one planned; and the arena to plan in from
    then on."""
    function, workers = step.function, step.workers
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
        original, step = step.original, None
        # A step that ran holds device memory (its functions' constants, folded when TensorFlow instantiated
        # them) until its graph's reference cycles are collected.
        # Left to the collector, it shares the arena with the next plan's step, which then measures high or,
        # instantiated in a full arena, crashes (SIGSEGV in ConstantFold's tensor::DeepCopy).
        gc.collect()
        step = _built(planner.analysis_of(plan), plan, backend, function, original, workers)
    return step, arena


def _plan_for_less(planner: Forms, arena: Arena, plan: SwapPlan, measured: Optional[int],
                   lowest_measured: Optional[int] = None) -> tuple[SwapPlan, Arena]:
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
        unplaced = "" if arena.unplaced is None or measured is not None else (
            f" The bytes fit, their buffers did not (fragmentation), as the allocator model foresaw: "
            f"{arena.unplaced}.")
        raise InfeasibleBudgetError(
            f"the optimized step {seen} on the device, over the {budget_bytes / MIB:.1f} MB budget, and "
            f"planning for less does not fit: {result.reason}{unplaced}",
            smallest_peak_bytes=result.smallest_peak_bytes, measured_peak_bytes=lowest_measured, floor=result.floor,
        )
    return lowest, arena  # the most-conserving plan: its measurement decides


def _measured_peak(step: OptimizedStep, function: capture.ConcreteFunction, sample_inputs: Any,
                   budget_bytes: int) -> Optional[int]:
    """Highest peak device bytes of `_CALIBRATION_CALLS` calls of `step` on `sample_inputs` (default:
    synthetic), or None if one ran out of memory. A call that does not fit waits in the allocator's retry
    (10 s on the emulated device) before it fails: an idle wait calibration expects.

    For a step of several workers: the highest over every worker (None when any ran out of memory),
    measured first with the step's collectives made local (`OptimizedStep.without_collectives`), then,
    where that fits `budget_bytes` on every worker, with its collectives. A worker that runs out of memory
    then aborts every worker's collectives: InfeasibleBudgetError on every worker."""
    args = inputs_like(function.structured_input_signature[0]) if sample_inputs is None else sample_inputs
    workers = step.workers
    if workers is None:
        return _peak_or_none(step, function, args)
    local = step.without_collectives()
    made_local = local is not None
    if made_local:
        measured = workers.highest([_peak_or_none(local, function, args)])[0]
        local = None
        gc.collect()  # the local step's folded constants leave the arena before the step runs
        if measured is None or measured > budget_bytes:
            return measured
    try:
        with stall_watch.expected_idle():
            measured = max(step_peaks(step, args, captured_variables(function), _CALIBRATION_CALLS))
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
