"""What a simulation gives: a device's memory over a schedule, and the swaps it was given (`sim.simulator`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from seqmem.ir.graph import TensorRef

__all__ = ["DeviceTimeline", "MemoryTrace", "SwapEvent"]


@dataclass(frozen=True)
class SwapEvent:
    """Move `tensor` off the device after node `out_after`; restore it before node `in_before`.

    resident_bytes: what stays on the device meanwhile (a compressed copy); restore_bytes: transient bytes
    the restoration needs besides the copy (a recomputed chain's other outputs), live while `in_before` runs.
    handle_bytes: what the host copy keeps on the device (`MachineModel.host_handle_bytes`), allocated once
    the tensor's producer ran, as the swap-out runs then, and freed once the copy is back.
    in_branch: `in_before` is a conditional that restores the copy in its branches, one such copy at a
    time: while it runs, the largest of its copies restored so is live, not their sum.
    """

    tensor: TensorRef
    out_after: str
    in_before: str
    resident_bytes: int = 0
    restore_bytes: int = 0
    handle_bytes: int = 0
    in_branch: bool = False


@dataclass(frozen=True)
class DeviceTimeline:
    """Memory of one device over the schedule; all sizes in bytes.

    live_bytes[i]: transient bytes live while the schedule's i-th node runs, as
    the allocator model counts them.
    peak_bytes: persistent_bytes + max(live_bytes).
    live_at_peak: the tensors owning the buffers live at the peak, largest first.
    tensor_persistent_bytes, tensor_live_bytes: the same sums of tensor sizes
    alone, without the allocator's rounding and fragmentation (equal to the
    above for the "exact" allocator).
    """

    device: str
    persistent_bytes: int
    live_bytes: tuple[int, ...]
    peak_bytes: int
    peak_step: int
    live_at_peak: tuple[tuple[TensorRef, int], ...]
    tensor_persistent_bytes: int
    tensor_live_bytes: tuple[int, ...]

    @property
    def tensor_peak_bytes(self) -> int:
        """tensor_persistent_bytes + max(tensor_live_bytes)."""
        return self.tensor_persistent_bytes + max(self.tensor_live_bytes, default=0)


@dataclass(frozen=True)
class MemoryTrace:
    """Result of `simulate`.

    order: the schedule simulated. devices: one timeline per device name ("" is
    the default device). unknown_size: tensors whose size is unknown (counted as 0).
    buffer_of: for every tensor, the tensor that owns the buffer it lives in
    (itself, or the source of a view or an in-place write).
    lifetimes: for every buffer owner, the schedule steps (allocated, freed) of
    its original device buffer (a swapped-in copy is not listed); freed is -1
    for buffers that outlive the step (persistent memory, graph outputs).
    """

    order: tuple[str, ...]
    devices: Mapping[str, DeviceTimeline]
    unknown_size: tuple[TensorRef, ...]
    buffer_of: Mapping[TensorRef, TensorRef]
    lifetimes: Mapping[TensorRef, tuple[int, int]]

    @property
    def peak_bytes(self) -> int:
        """The highest peak over all devices, in bytes."""
        return max((t.peak_bytes for t in self.devices.values()), default=0)

    def busiest(self) -> DeviceTimeline:
        """The timeline of the device with the highest peak."""
        return max(self.devices.values(), key=lambda t: t.peak_bytes)
