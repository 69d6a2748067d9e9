"""The swap plan: what `seqmem.optimize` decided, as plain data.

A `SwapPlan` lists every swapped tensor with its size, the backward nodes that
read it back, and the trigger node after which it is brought back; every loop
accumulator swapped element by element (`LoopSwap`); the budget; the predicted
peak before and after; what was skipped and why. The rewriter
takes only a graph and a plan; reports read the plan. `to_json`/`from_json`
round-trip it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from seqmem.ir.graph import TensorRef
from seqmem.units import MIB

__all__ = ["LoopSwap", "SkippedCandidate", "SwapDecision", "SwapPlan"]


@dataclass(frozen=True)
class SwapDecision:
    """Swap `tensor` to host after its forward readers, and back before `consumers`.

    consumers: the backward nodes that read the swapped-in copy.
    trigger: the node whose completion starts the swap-in (a control edge).
    transfer_s: predicted seconds of one device<->host copy of the tensor.
    """

    tensor: TensorRef
    size_bytes: int
    consumers: tuple[str, ...]
    trigger: str
    transfer_s: float


@dataclass(frozen=True)
class LoopSwap:
    """A loop accumulator (TensorList) whose elements go to host memory one per iteration
    (`seqmem.edge.loop_swap`).

    accumulator: its `EmptyTensorList` node; forward_loop/gradient_loop: the While nodes that fill and
    empty it, forward_index/gradient_index: its loop-variable index in each. dtype, element_shape (None
    where unknown: a dimension, or the whole shape) and element_bytes (None unless the shape is fully
    known): one element, i.e. what one iteration saves.
    """

    accumulator: str
    forward_loop: str
    forward_index: int
    gradient_loop: str
    gradient_index: int
    dtype: str
    element_shape: tuple[int | None, ...] | None
    element_bytes: int | None

    @property
    def tensor(self) -> TensorRef:
        """The full list, as the forward loop outputs it and the gradient loop reads it."""
        return TensorRef(self.forward_loop, self.forward_index)


@dataclass(frozen=True)
class SkippedCandidate:
    """A feature map the selector did not swap, and why."""

    tensor: TensorRef
    size_bytes: int
    reason: str


@dataclass(frozen=True)
class SwapPlan:
    """The optimizer's decisions; sizes in bytes, times in seconds.

    budget_bytes: the caller's budget; target_bytes: the peak the selector
    planned for (below the budget by `optimize`'s safety margin, or lower
    after calibration measured more than predicted).
    feasible: predicted_peak_after_bytes <= budget_bytes.
    predicted_overhead_s: transfer time the schedule cannot hide behind compute.
    measured_peak_bytes: the optimized step's peak measured on the device, when
    `optimize` calibrated it.
    pinned_order: the order the rewritten step is pinned to (`seqmem.swap.pin`),
    swap nodes aside; empty when it is not pinned.
    loop_parallel_iterations: the most iterations any while loop of the step
    runs at once (`seqmem.edge.loops`); None: loops as traced.
    loop_swaps: loop accumulators swapped element by element; each loop then
    holds at most `loop_parallel_iterations` of their elements on the device.
    loop_swapped_bytes: the device bytes their full lists held.
    """

    budget_bytes: int
    target_bytes: int
    predicted_peak_before_bytes: int
    predicted_peak_after_bytes: int
    decisions: tuple[SwapDecision, ...] = ()
    skipped: tuple[SkippedCandidate, ...] = ()
    predicted_overhead_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    measured_peak_bytes: int | None = None
    pinned_order: tuple[str, ...] = ()
    loop_parallel_iterations: int | None = None
    loop_swaps: tuple[LoopSwap, ...] = ()
    loop_swapped_bytes: int = 0

    @property
    def feasible(self) -> bool:
        return self.predicted_peak_after_bytes <= self.budget_bytes

    @property
    def swapped_bytes(self) -> int:
        return sum(d.size_bytes for d in self.decisions)

    def summary(self) -> str:
        """A readable table of the plan."""
        lines = [
            f"budget {self.budget_bytes / MIB:.1f} MB (planned for {self.target_bytes / MIB:.1f} MB); predicted peak {self.predicted_peak_before_bytes / MIB:.1f} MB "
            f"-> {self.predicted_peak_after_bytes / MIB:.1f} MB ({'fits' if self.feasible else 'does NOT fit'})",
            f"{len(self.decisions)} tensors swapped ({self.swapped_bytes / MIB:.1f} MB), "
            f"predicted overhead {1e3 * self.predicted_overhead_s:.2f} ms; {len(self.skipped)} candidates skipped",
        ]
        if self.loop_swaps:
            loops = len({swap.forward_loop for swap in self.loop_swaps})
            lines.append(f"{len(self.loop_swaps)} loop accumulators of {loops} loop(s) swapped element by element "
                         f"({self.loop_swapped_bytes / MIB:.1f} MB; prefetch depth "
                         f"{self.loop_parallel_iterations} iteration(s))")
        if self.pinned_order:
            lines.append(f"pinned to its planned order ({len(self.pinned_order)} nodes; see seqmem.swap.pin)")
        if self.loop_parallel_iterations is not None:
            lines.append(f"while loops run at most {self.loop_parallel_iterations} iteration(s) at once "
                         f"(see seqmem.edge.loops)")
        if self.measured_peak_bytes is not None:
            lines.append(f"measured peak {self.measured_peak_bytes / MIB:.1f} MB")
        lines += list(self.notes)
        if self.decisions:
            lines.append(f"{'MB':>8}  {'transfer ms':>11}  tensor -> trigger")
            for d in self.decisions:
                lines.append(f"{d.size_bytes / MIB:8.2f}  {1e3 * d.transfer_s:11.3f}  {d.tensor} -> {d.trigger}")
        loops: dict[tuple[str, str], list[LoopSwap]] = {}
        for swap in self.loop_swaps:
            loops.setdefault((swap.forward_loop, swap.gradient_loop), []).append(swap)
        for (forward, gradient), swaps in loops.items():
            lines.append(f"loop {forward} -> gradient loop {gradient}:")
            lines.append(f"{'KB/step':>8}  {'element':>16}  accumulator")
            for swap in swaps:
                shape = "?" if swap.element_shape is None else "x".join("?" if d is None else str(d)
                                                                        for d in swap.element_shape)
                lines.append(f"{(swap.element_bytes or 0) / 1024:8.1f}  {swap.dtype + '[' + shape + ']':>16}  "
                             f"{swap.accumulator}")
        return "\n".join(lines)

    def to_json(self) -> str:
        data = asdict(self)
        for item in data["decisions"] + data["skipped"]:
            item["tensor"] = str(TensorRef(*item["tensor"]))
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "SwapPlan":
        data = json.loads(text)
        decisions = tuple(
            SwapDecision(**{**d, "tensor": TensorRef.parse(d["tensor"]), "consumers": tuple(d["consumers"])})
            for d in data.pop("decisions")
        )
        skipped = tuple(SkippedCandidate(**{**s, "tensor": TensorRef.parse(s["tensor"])}) for s in data.pop("skipped"))
        loop_swaps = tuple(
            LoopSwap(**{**s, "element_shape": None if s["element_shape"] is None else tuple(s["element_shape"])})
            for s in data.pop("loop_swaps", ())
        )
        return cls(**{**data, "notes": tuple(data.get("notes", ())), "pinned_order": tuple(data.get("pinned_order", ()))},
                   decisions=decisions, skipped=skipped, loop_swaps=loop_swaps)
