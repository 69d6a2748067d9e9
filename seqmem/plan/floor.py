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

from seqmem.analyze.analysis import StepAnalysis
from seqmem.analyze.anatomy import StepAnatomy
from seqmem.ir.graph import Graph, TensorRef
from seqmem.ir.op_tables import FUNCTIONAL_COND_OPS, FUNCTIONAL_OPS
from seqmem.sim.trace import DeviceTimeline, MemoryTrace
from seqmem.decisions.plan import Plan
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
    buffers, largest first. until, until_type: the last node of the schedule before the bytes in use drop
    below the peak (`op` itself where the peak lasts one node): ops that allocate nothing (a function's
    captured handles) can stand between the peak's first node and the one that reads what is held.
    """

    op: str
    op_type: str
    peak_bytes: int
    persistent_bytes: int
    working_bytes: int
    held: tuple[HeldBuffer, ...]
    until: str = ""
    until_type: str = ""

    @property
    def held_bytes(self) -> int:
        return sum(buffer.size_bytes for buffer in self.held)

    def describe(self, largest: int = 2) -> str:
        """One sentence: the split, and the largest held buffers with their reasons."""
        text = f"the peak lasts until {self.until_type} '{self.until}'; " if self.until != self.op else ""
        text += (f"of it {self.persistent_bytes / MIB:.1f} MB live through the step (weights, optimizer slots, "
                f"inputs), {self.working_bytes / MIB:.1f} MB the op's own inputs, outputs and scratch, "
                f"{self.held_bytes / MIB:.1f} MB held by {len(self.held)} other buffers")
        if self.held[:largest]:
            text += " (largest: " + "; ".join(
                f"{b.tensor} {b.size_bytes / MIB:.1f} MB, {b.why}" for b in self.held[:largest]) + ")"
        return text


def floor_of(analysis: StepAnalysis, trace: MemoryTrace, plan: Plan) -> Floor:
    """The floor of `plan`, whose simulation of `analysis` is `trace` (on its busiest device)."""
    graph, anatomy = analysis.graph, analysis.anatomy
    device = trace.busiest()
    name = trace.order[device.peak_step]
    node = graph.node(name)

    def owner(ref: TensorRef) -> TensorRef:  # decisions name a tensor; the trace, the owner of its buffer
        return trace.buffer_of.get(ref, ref)

    def keys(refs) -> set:  # a restored copy's buffer is named by the conserved tensor, others by their owner
        return {key for ref in refs for key in (ref, owner(ref))}

    used = keys((*node.inputs, *(TensorRef(name, i) for i in range(len(node.outputs)))))
    until = _peak_end(trace, device)
    read_at_end = keys(graph.node(until).inputs)
    conserved = {key: decision.kind.name for decision in plan.decisions for key in keys([decision.tensor])}
    skipped = {owner(item.tensor): item.reason for item in plan.skipped}
    held = tuple(HeldBuffer(tensor, size, _why_held(tensor, anatomy, conserved, skipped, graph, until, read_at_end))
                 for tensor, size in device.live_at_peak if tensor not in used)
    working = device.peak_bytes - device.persistent_bytes - sum(buffer.size_bytes for buffer in held)
    return Floor(name, node.op, device.peak_bytes, device.persistent_bytes, working, held, until, graph.node(until).op)


def _peak_end(trace: MemoryTrace, device: DeviceTimeline) -> str:
    """The last node of the schedule, from the peak's, before the device's bytes in use drop."""
    step = device.peak_step
    while step + 1 < len(device.live_bytes) and device.live_bytes[step + 1] == device.live_bytes[device.peak_step]:
        step += 1
    return trace.order[step]


def _why_held(tensor: TensorRef, anatomy: StepAnatomy, conserved: dict, skipped: dict, graph: Graph, until: str,
              read_at_end: set) -> str:
    if tensor in read_at_end and graph.node(until).op in FUNCTIONAL_OPS - FUNCTIONAL_COND_OPS:
        how = f"conserved ({conserved[tensor]}) and restored for" if tensor in conserved else "an input of"
        return (f"{how} {graph.node(until).op} '{until}', a function call: it takes every input on the device "
                "at once, and seqmem plans nothing inside function bodies")
    if tensor in conserved:
        return f"conserved ({conserved[tensor]}) and on the device here"
    if tensor in skipped:
        return f"not conserved: {skipped[tensor]}"
    if tensor.node in anatomy.backward:
        return "computed in backward, not a candidate"
    if tensor.node in anatomy.forward:
        return "a forward tensor not read in backward after this op"
    return "outside the forward and backward passes (the update, or inputs' copies)"
