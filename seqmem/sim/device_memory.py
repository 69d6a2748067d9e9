"""A device's memory as the simulator keeps it: the allocator model, the bytes of live tensors, and what exists
before the step runs (variables, inputs, the constants TensorFlow folds and instantiates)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from seqmem.ir.graph import Graph, TensorRef
from seqmem.ir.op_tables import STEP_ARGUMENT_OPS
from seqmem.sim.allocator import BFCAllocatorModel, ExactAllocator
from seqmem.sim.trace import MemoryTrace

__all__ = ["DeviceMemory", "instantiate", "timeline_name", "with_in_use_before"]


def timeline_name(device: str, default_device: str) -> str:
    """The timeline a node placed on `device` runs on: the device's short name ("CPU:0"); "" for the
    default device, placed by name or unplaced."""
    marker = "device:"
    short = device[device.index(marker) + len(marker):] if marker in device else device
    return "" if short == default_device else short


class DeviceMemory:
    """One device's allocator model, the sum of its live tensor sizes, and what of both is persistent
    (`before_step_chunk_bytes`: the chunks of the variables and inputs, which exist before the step runs)."""

    def __init__(self, allocator: str, limit_bytes: int | None, reserved_arena: bool) -> None:
        self.model = BFCAllocatorModel(limit_bytes, reserved_arena) if allocator == "bfc" else ExactAllocator()
        self.tensor_bytes = 0
        self.persistent_bytes = 0
        self.before_step_chunk_bytes = 0
        self.tensor_persistent_bytes = 0
        self.persistent_handles: dict[TensorRef, int] = {}

    def allocate(self, size: int, pieces: int = 1) -> int:
        self.tensor_bytes += size
        return self.model.allocate(size, pieces)

    def free(self, handle: int, size: int) -> None:
        self.tensor_bytes -= size
        self.model.free(handle)

    def allocate_filled(self, lists: Sequence[tuple[int, int]], body_bytes: int, body_pieces: int) -> list[int]:
        """Handles of the lists a loop fills, `(bytes, elements)` each, placed as the loop runs one iteration
        at a time: each iteration's body (`body_bytes` in `body_pieces`) is allocated, then that iteration's
        element of each list, then the body is freed."""
        elements: list[list[int]] = [[] for _ in lists]
        for iteration in range(max(count for _, count in lists)):
            body = self.model.allocate(body_bytes, body_pieces) if body_bytes else None
            for handles, (size, count) in zip(elements, lists):
                if iteration < count:
                    handles.append(self.model.allocate(size // count))
            if body is not None:
                self.model.free(body)
        self.tensor_bytes += sum(size for size, _ in lists)
        return [self.model.group(handles) for handles in elements]

    def allocate_persistent(self, owner: TensorRef, size: int, before_step: bool = False) -> None:
        if owner not in self.persistent_handles:
            before = self.model.in_use_bytes
            self.persistent_handles[owner] = self.allocate(size)
            self.persistent_bytes += self.model.in_use_bytes - before
            self.tensor_persistent_bytes += size
            if before_step:
                self.before_step_chunk_bytes += self.model.in_use_bytes - before


def instantiate(graph: Graph, memories: dict, allocator: tuple, default_device: str) -> None:
    """Allocate, in `memories`, what is on the device before the step runs, in the order it got there:

    - the variables behind the step's resource handles (`Node.resource_bytes`), in graph order: a function
      captures them in the order its forward pass first reads them, which is the order a Keras model
      creates them (its optimizer's slots last), not in the order the step first reads them;
    - the step's inputs (`STEP_ARGUMENT_OPS`), placed on the device before it is called;
    - its constants, its own (`Const` nodes and those TensorFlow folds nodes into, `Node.folded`) in graph
      order, then those its calls and loops hold (`Node.constant_sizes`), each its own buffer: a constant's
      kernel allocates it when TensorFlow instantiates the step, calls inlined and loops lowered into it,
      before the step's first op runs. (Placed as the schedule reaches them instead, the constants' small
      chunks would land inside the regions the step's own tensors free, and split them for every later
      call.)"""
    def memory_of(node) -> DeviceMemory:
        device = timeline_name(node.device, default_device)
        if device not in memories:
            memories[device] = DeviceMemory(*allocator)
        return memories[device]

    for name, node in graph.nodes.items():
        if node.resource_bytes:
            memory_of(node).allocate_persistent(TensorRef(name, -1), node.resource_bytes, before_step=True)
    def place_outputs(name: str, node, before_step: bool) -> None:
        for index, info in enumerate(node.outputs):
            if info.size_bytes:
                memory_of(node).allocate_persistent(TensorRef(name, index), info.size_bytes, before_step)

    for name, node in graph.nodes.items():
        if node.op in STEP_ARGUMENT_OPS:
            place_outputs(name, node, before_step=True)
    for name, node in graph.nodes.items():
        if node.persistent and node.op not in STEP_ARGUMENT_OPS:
            place_outputs(name, node, before_step=False)
    for name, node in graph.nodes.items():
        for index, size in enumerate(node.constant_sizes):  # owners -2, -3, ...: -1 is the resource
            memory_of(node).allocate_persistent(TensorRef(name, -2 - index), size)


def with_in_use_before(trace: MemoryTrace, memories: Mapping[str, DeviceMemory],
                        in_use_before_bytes: Mapping[str, int]) -> MemoryTrace:
    """`trace` with each device of `in_use_before_bytes` counting those bytes, measured, for the chunks the
    model gave its variables and inputs."""
    devices = dict(trace.devices)
    for device, measured in in_use_before_bytes.items():
        if device not in devices:
            continue
        shift = measured - memories[device].before_step_chunk_bytes
        timeline = devices[device]
        devices[device] = dataclasses.replace(timeline, persistent_bytes=timeline.persistent_bytes + shift,
                                              peak_bytes=timeline.peak_bytes + shift)
    return dataclasses.replace(trace, devices=devices)
