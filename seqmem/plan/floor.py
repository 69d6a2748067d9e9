"""What the lowest peak a plan reaches is made of: the answer to "why does no plan fit?".

At the op where the lowest plan's predicted peak is reached, the bytes split into what lives through the
step (weights, optimizer slots, inputs), the op's own working set (the buffers it reads and writes, and its
kernel's scratch and the allocator's rounding: no plan frees them while the op runs), and the other
buffers held there, each with why the plan did not move it. A floor whose held bytes are small is the
step's unavoidable working set under this schedule; one with large held bytes names what would have to be
conserved for the step to go lower.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqmem.analysis import StepAnalysis
from seqmem.anatomy import StepAnatomy
from seqmem.ir.graph import TensorRef
from seqmem.sim.trace import MemoryTrace
from seqmem.swap.plan import SwapPlan
from seqmem.units import MIB

__all__ = ["Floor", "HeldBuffer", "floor_of"]


@dataclass(frozen=True)
class HeldBuffer:
    """A buffer live at the floor that the op does not use: its owner, bytes, and why it is there."""

    tensor: TensorRef
    size_bytes: int
    why: str


@dataclass(frozen=True)
class Floor:
    """The lowest plan's predicted peak at its op, in bytes: persistent_bytes + working_bytes + held bytes.

    op, op_type: the node at the peak and its op. working_bytes: the buffers the op reads and writes, plus
    what the allocator model counts there beyond the tensors (scratch, rounding). held: the other live
    buffers, largest first.
    """

    op: str
    op_type: str
    peak_bytes: int
    persistent_bytes: int
    working_bytes: int
    held: tuple[HeldBuffer, ...]

    @property
    def held_bytes(self) -> int:
        return sum(buffer.size_bytes for buffer in self.held)

    def describe(self, largest: int = 2) -> str:
        """One sentence: the split, and the largest held buffers with their reasons."""
        text = (f"of it {self.persistent_bytes / MIB:.1f} MB live through the step (weights, optimizer slots, "
                f"inputs), {self.working_bytes / MIB:.1f} MB the op's own inputs, outputs and scratch, "
                f"{self.held_bytes / MIB:.1f} MB held by {len(self.held)} other buffers")
        if self.held[:largest]:
            text += " (largest: " + "; ".join(
                f"{b.tensor} {b.size_bytes / MIB:.1f} MB, {b.why}" for b in self.held[:largest]) + ")"
        return text


def floor_of(analysis: StepAnalysis, trace: MemoryTrace, plan: SwapPlan) -> Floor:
    """The floor of `plan`, whose simulation of `analysis` is `trace` (on its busiest device)."""
    graph, anatomy = analysis.graph, analysis.anatomy
    device = trace.busiest()
    name = trace.order[device.peak_step]
    node = graph.node(name)

    def owner(ref: TensorRef) -> TensorRef:  # decisions name a tensor; the trace, the owner of its buffer
        return trace.buffer_of.get(ref, ref)

    used = {owner(ref) for ref in (*node.inputs, *(TensorRef(name, i) for i in range(len(node.outputs))))}
    conserved = {owner(decision.tensor): decision.kind.name for decision in plan.decisions}
    skipped = {owner(item.tensor): item.reason for item in plan.skipped}
    held = tuple(HeldBuffer(tensor, size, _why_held(tensor, anatomy, conserved, skipped))
                 for tensor, size in device.live_at_peak if tensor not in used)
    working = device.peak_bytes - device.persistent_bytes - sum(buffer.size_bytes for buffer in held)
    return Floor(name, node.op, device.peak_bytes, device.persistent_bytes, working, held)


def _why_held(tensor: TensorRef, anatomy: StepAnatomy, conserved: dict, skipped: dict) -> str:
    if tensor in conserved:
        return f"conserved ({conserved[tensor]}) and on the device here"
    if tensor in skipped:
        return f"not conserved: {skipped[tensor]}"
    if tensor.node in anatomy.backward:
        return "computed in backward, not a candidate"
    if tensor.node in anatomy.forward:
        return "a forward tensor not read in backward after this op"
    return "outside the forward and backward passes (the update, or inputs' copies)"
