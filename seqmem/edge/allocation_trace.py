"""The device allocator's own record of one step: every allocation and free, with the op that made it.

TensorFlow's BFC allocator reports each allocation and deallocation to the
profiler (`MemoryAllocation`/`MemoryDeallocation` events on the host plane)
with the chunk's address and bytes, the op and shape it was allocated for, and
the bytes in use after it. Replayed, the events give the memory in use over the
step and the buffers live at its peak, op by op: what a prediction of the peak
can be checked against, buffer by buffer (`seqmem profile --at-peak N`).

Needs a BFC allocator: on the emulated device, or a GPU. Bytes are the chunks
the allocator handed out (its rounding and padding included), as
`get_memory_info` counts them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tensorflow.tsl.profiler.protobuf import xplane_pb2

from seqmem.edge.op_trace import profiled_space

__all__ = ["AllocatorEvent", "AllocationTrace", "trace_allocations"]

_EVENTS = ("MemoryAllocation", "MemoryDeallocation")


@dataclass(frozen=True)
class AllocatorEvent:
    """One allocation (`allocated`) or free of a chunk at `address`, of `chunk_bytes`; `op` and `shape` of the
    tensor it was allocated for ("" where the allocator was not told; a step seqmem rewrote runs its graph
    imported under the scope "seqmem/"); `in_use_bytes` after it."""

    allocated: bool
    address: int
    chunk_bytes: int
    op: str
    shape: str
    in_use_bytes: int


@dataclass(frozen=True)
class AllocationTrace:
    """The allocator's events of one call, in order."""

    events: tuple[AllocatorEvent, ...]

    @property
    def in_use_before_bytes(self) -> int:
        """Bytes in use when the call started (0 for an empty trace)."""
        if not self.events:
            return 0
        first = self.events[0]
        return first.in_use_bytes + (-first.chunk_bytes if first.allocated else first.chunk_bytes)

    @property
    def peak_index(self) -> int:
        """Index of the event after which the most bytes were in use (ValueError for an empty trace)."""
        if not self.events:
            raise ValueError("the trace has no allocator events: was the step run on a BFC allocator?")
        return max(range(len(self.events)), key=lambda i: self.events[i].in_use_bytes)

    def live_after(self, index: int) -> list[AllocatorEvent]:
        """The allocations of this call still live after event `index` (what was allocated before the call
        is not listed: weights, optimizer slots, constants kept from an earlier call)."""
        live: dict[int, AllocatorEvent] = {}
        for event in self.events[:index + 1]:
            if event.allocated:
                live[event.address] = event
            else:
                live.pop(event.address, None)
        return list(live.values())

    @staticmethod
    def bytes_by_op(allocations: Sequence[AllocatorEvent]) -> list[tuple[str, int, int]]:
        """(op, chunk bytes, allocations) per op of `allocations`, most bytes first."""
        total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for event in allocations:
            total[event.op][0] += event.chunk_bytes
            total[event.op][1] += 1
        return sorted(((op, size, count) for op, (size, count) in total.items()), key=lambda row: (-row[1], row[0]))


def trace_allocations(step: Callable[..., Any], args: Sequence[Any]) -> AllocationTrace:
    """Run `step(*args)` once (a warm-up, which also instantiates its functions), then once under the
    profiler, and return the allocator's events of that second call. The caller is responsible for any
    state `step` changes (variables). Raises RuntimeError when the profiler wrote no trace."""
    space = profiled_space(step, args)
    return AllocationTrace(tuple(event for _, event in sorted(_events(space), key=lambda item: item[0])))


def _events(space: xplane_pb2.XSpace):
    """(time in ps, AllocatorEvent) of every allocator event on the host planes."""
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        stat_names = {key: metadata.name for key, metadata in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if name not in _EVENTS:
                    continue
                stats = {}
                for stat in event.stats:
                    kind = stat.WhichOneof("value")
                    value = getattr(stat, kind)
                    stats[stat_names.get(stat.metadata_id, "")] = (
                        plane.stat_metadata[value].name if kind == "ref_value" else value)
                op = str(stats.get("tf_op", ""))
                yield line.timestamp_ns * 1000 + event.offset_ps, AllocatorEvent(
                    allocated=name == _EVENTS[0], address=int(stats.get("addr", 0)),
                    chunk_bytes=int(stats.get("allocation_bytes", 0)), op="" if op == "(null)" else op,
                    shape=str(stats.get("shape", "")),
                    in_use_bytes=int(stats.get("bytes_allocated", 0)))
