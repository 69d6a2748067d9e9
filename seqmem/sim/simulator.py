"""Memory simulator: live device bytes over one execution of a graph.

Model (that of TensorFlow's executor with a BFC allocator):
- A tensor's buffer is allocated when its producer runs and freed after its last
  reader ran. Outputs nobody reads are freed right away; graph outputs live to
  the end.
- View ops (Identity, Reshape, ReadVariableOp, ...) share their input's buffer;
  element-wise ops write into an input buffer of the same size whose last reader
  they are (`op_tables.INPLACE_OPS`), and a few others into one given input
  (`op_tables.FORWARDING_OPS`: the cross-entropy gradient over the logits).
- A while loop is one node. Its outputs replace the carried values it reads
  last (an input the same size as the output of its index: freed as the loop
  starts); its lists, which it fills or empties, stay. Its loop invariants,
  and what a called function returns unchanged, share the input's buffer
  (`TensorInfo.passes_input`). One iteration's body is charged as the loop's
  scratch, a function call's body as the call's and a conditional's largest
  branch as its own (`seqmem.edge.bodies`). A call's or a conditional's body
  is placed in 1 MiB pieces (`BODY_PIECE_BYTES`): its bytes are its many
  tensors, not one buffer, and as one request the allocator model would hand
  them a free chunk up to twice their size.
  A list's elements are buffers of their own (`TensorInfo.element_bytes`):
  the allocator model places each one. A loop whose body's `Iteration` is
  known (`iterations`) runs it through the allocator model once per element of
  the lists it fills (`sim.iteration.replay`): each iteration allocates and
  frees its body's buffers in the order the body runs, and places each list's
  element as the iteration writes it, as a loop bounded to one iteration at a
  time runs; the loop is charged the most that held. Which free chunk a
  request gets, and so the padding the BFC allocator adds, follows from that
  order.
  Without an `Iteration`, the body is placed in 1 MiB pieces before each
  iteration's elements.
- Parameters, constants, inputs, variables behind resource handles, the
  outputs of nodes TensorFlow folds into constants (`Node.folded`) and the
  constants a called function or a loop's body holds (`Node.constant_sizes`)
  are persistent: counted once, for the whole step. What exists before the
  step runs is placed first (`sim.device_memory.instantiate`): the variables
  behind its resource handles, in graph order (the order the step captured
  them, as the model created them), its inputs, then its constants (`Const`
  nodes and folded ones) and those of its calls and loops, which TensorFlow
  allocates when it instantiates the step. The "bfc" model runs the step once
  before the pass it reports, and frees that call's results, as a caller that
  dropped them: a measured later call finds the arena as the first left it.
  Where the bytes in use on a device before the step first ran were measured
  (`in_use_before_bytes`: its variables and inputs, and whatever else the process
  holds there), they replace the allocator model's chunks for the variables and
  inputs in the persistent bytes: the model places those in an empty arena,
  without the history (initializers, temporaries) that decided their chunks.
- While a node runs, its inputs, its outputs and its scratch memory
  (`scratch_bytes`) are all live: `live_bytes[i]` is the transient
  memory while `order[i]` runs.
- A `SwapEvent` moves a tensor to the host after `out_after` runs (once the
  readers scheduled before `in_before` are done) and brings a fresh device copy
  back just before `in_before` runs; readers from `in_before` on read the copy.
  A compressed tensor keeps `resident_bytes` on the device meanwhile; restoring
  it (casting back, or recomputing it) holds `restore_bytes` more while
  `in_before` runs, with the compressed copy. Copies a conditional restores in
  its branches (`SwapEvent.in_branch`) come back one at a time: the largest
  of them is live while it runs.

Linear in the size of the graph: one pass over `order` (two with the "bfc"
model), plus, per loop, its iterations (one for a loop that fills no list) times its
body's buffers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from seqmem.gc_pause import without_gc
from seqmem.ir.graph import Graph, TensorRef, view_source
from seqmem.ir.op_tables import (FORWARDING_OPS, FUNCTIONAL_LOOP_OPS, FUNCTIONAL_OPS, INPLACE_OPS, LOOP_BACK_OPS,
                                 LOOP_MERGE_OPS)
from seqmem.sim.device_memory import DeviceMemory, instantiate, timeline_name, with_in_use_before
from seqmem.sim.iteration import Iteration, replay
from seqmem.sim.scratch import static_scratch_bytes
from seqmem.sim.trace import DeviceTimeline, MemoryTrace, SwapEvent

__all__ = ["BODY_PIECE_BYTES", "body_pieces", "simulate"]

BODY_PIECE_BYTES = 1 << 20


class _Buffer:
    __slots__ = ("size", "pieces", "device", "owner", "pending", "persistent", "start", "end", "handle")

    def __init__(self, size: int, device: str, owner: TensorRef, persistent: bool, start: int, pieces: int = 1) -> None:
        self.size, self.pieces, self.device, self.owner = size, pieces, device, owner
        self.persistent, self.start = persistent, start
        self.pending = 0
        self.end = -1
        self.handle = -1


_ALLOCATORS = ("bfc", "exact")


@without_gc
def simulate(
    graph: Graph,
    order: Sequence[str],
    swaps: Iterable[SwapEvent] = (),
    allocator: str = "exact",
    scratch_bytes: Mapping[str, int] | None = None,
    limit_bytes: int | None = None,
    reserved_arena: bool = False,
    in_use_before_bytes: Mapping[str, int] | None = None,
    iterations: Mapping[str, Iteration] | None = None,
    default_device: str = "",
) -> MemoryTrace:
    """Live-bytes timeline of running `graph` in `order`, with optional swaps.

    order: every node of the graph once, each after its predecessors.
    allocator: "exact" counts tensor bytes; "bfc" counts the chunks TensorFlow's
    BFC allocator would hand out (see `seqmem.sim.allocator`), after one warm-up
    run of the step, as a measured second step sees it.
    scratch_bytes: bytes of scratch memory each node holds while it runs
    (default: `sim.scratch.static_scratch_bytes`, a model of the largest known ones).
    limit_bytes: the arena's size for the "bfc" model; its regions cannot grow
    past it, so fragmentation can exhaust it before the bytes in use do.
    reserved_arena: the "bfc" model's arena is reserved up front instead of grown
    (`StepAnalysis.arena_reserved`, `seqmem.sim.allocator`).
    in_use_before_bytes: bytes measured in use on a device (by its name in the trace: "" for the default
    device) before the step first ran (`StepAnalysis.in_use_before_bytes`); on that device they replace
    the model's chunks for the variables and inputs in `persistent_bytes` and the peak.
    iterations: each while loop's `Iteration`, by node name (`StepAnalysis.iterations`): the loop runs it
    through the allocator model once per element of the lists it fills (`sim.iteration.replay`), its
    scratch beyond the iteration's peak held meanwhile, and is charged the most it held then.
    default_device: the short name ("CPU:0") of the device unplaced nodes run on; nodes placed on it by
    name run on the default device's timeline, "" (`StepAnalysis.default_device`).
    Raises ValueError if `order` is not a valid schedule of the graph, a swap
    refers to nodes out of order, or `allocator` is unknown; SimulatedOutOfMemoryError when the
    "bfc" model cannot place a buffer within `limit_bytes`.
    """
    if allocator not in _ALLOCATORS:
        raise ValueError(f"allocator must be one of {_ALLOCATORS}, got {allocator!r}")
    position = {name: i for i, name in enumerate(order)}
    _check_order(graph, order, position)
    swap_by_tensor = _index_swaps(graph, swaps, position)
    if scratch_bytes is None:
        scratch_bytes = static_scratch_bytes(graph)
    memories: dict[str, DeviceMemory] = {}
    model = (allocator, limit_bytes, reserved_arena)
    instantiate(graph, memories, model, default_device)
    if allocator == "bfc":  # the warm-up call, its results dropped by the caller before the next
        _run(graph, order, position, swap_by_tensor, memories, model, scratch_bytes, iterations or {},
             default_device).release_outputs()
    run = _run(graph, order, position, swap_by_tensor, memories, model, scratch_bytes, iterations or {},
               default_device)
    return with_in_use_before(run.trace(order), memories, in_use_before_bytes or {})


def _run(graph, order, position, swap_by_tensor, memories, allocator, scratch_bytes, iterations,
         default_device) -> "_Pass":
    """One pass over the schedule, allocating from (and leaving state in) `memories`."""
    run = _Pass(graph, position, swap_by_tensor, memories, allocator, default_device)
    for step, name in enumerate(order):
        node = graph.nodes[name]
        iteration = iterations.get(name) if node.op in FUNCTIONAL_LOOP_OPS else None
        run.step(step, node, scratch_bytes.get(name, 0), iteration)
    return run


class _Pass:
    """The state of one pass over a schedule: every tensor's buffer, the restored copies, and the live bytes
    per device after each step. `step` runs one node: restores due before it, its outputs placed (or
    sharing an input's buffer), its scratch held while it runs, the live bytes recorded, then its inputs
    released and the swaps due after it made."""

    def __init__(self, graph: Graph, position: Mapping[str, int], swap_by_tensor: Mapping[TensorRef, SwapEvent],
                 memories: dict[str, DeviceMemory], allocator: tuple, default_device: str) -> None:
        self.graph, self.position, self.swap_by_tensor = graph, position, swap_by_tensor
        self.memories, self.allocator, self.default_device = memories, allocator, default_device
        self.swap_ins_before: dict[int, list[TensorRef]] = {}
        self.swap_outs_after: dict[int, list[TensorRef]] = {}
        self.handles_after: dict[int, list[SwapEvent]] = {}  # by the producer's step
        for ref, event in swap_by_tensor.items():
            self.swap_ins_before.setdefault(position[event.in_before], []).append(ref)
            self.swap_outs_after.setdefault(position[event.out_after], []).append(ref)
            if event.handle_bytes:
                self.handles_after.setdefault(position[ref.node], []).append(event)
        self.graph_outputs = set(graph.outputs)
        self.buffer_of: dict[TensorRef, _Buffer] = {}
        self.copy_of: dict[TensorRef, _Buffer] = {}
        self.resident: dict[TensorRef, int] = {}  # handles of compressed copies
        self.host_handles: dict[TensorRef, int] = {}  # allocator handles of the host copies' device handles
        self.buffers: list[_Buffer] = []
        self.timelines: dict[str, tuple[list[int], list[int]]] = {}
        self.unknown: list[TensorRef] = []
        self._short_devices: dict[str, str] = {}

    def step(self, step: int, node, scratch: int, iteration: Iteration | None) -> None:
        device = self._short_devices.get(node.device)
        if device is None:
            device = self._short_devices[node.device] = timeline_name(node.device, self.default_device)
        if device not in self.memories:
            self.memories[device] = DeviceMemory(*self.allocator)
        memory = self.memories[device]
        restoring = self._restore(step)
        # a loop's carried values: the loop's outputs take their place once the first iteration ran
        carried = (_carried_inputs(node, self.buffer_of, self.swap_by_tensor)
                   if node.op in FUNCTIONAL_LOOP_OPS else ())
        for index in carried:
            self._release(self.buffer_of[node.inputs[index]], step)
        new_buffers, filled = self._outputs(step, node, device, memory)
        replayed = None
        if iteration is not None:
            replayed = replay(memory.model, iteration, {index: (b.size, b.pieces) for index, b in filled},
                              body_pieces(scratch - iteration.peak_bytes), memory.tensor_bytes)
            for index, buffer in filled:
                buffer.handle = replayed.list_handles[index]
            memory.tensor_bytes += sum(buffer.size for _, buffer in filled)
            scratch = 0
        elif filled:
            handles = memory.allocate_filled([(b.size, b.pieces) for _, b in filled], scratch, _piece_count(scratch))
            for (_, buffer), handle in zip(filled, handles):
                buffer.handle = handle
        body = node.op in FUNCTIONAL_OPS  # a body's bytes are its many tensors, placed in pieces
        scratch_handle = memory.allocate(scratch, _piece_count(scratch) if body else 1) if scratch else None
        self._record(step, memory, replayed)
        if scratch_handle is not None:
            memory.free(scratch_handle, scratch)
        for held, handle, size in restoring:
            held.free(handle, size)
        for index, ref in enumerate(node.inputs):
            if index not in carried:
                self._release(self._read_buffer(ref, step), step)
        for buffer in new_buffers:
            if buffer.pending == 0 and not buffer.persistent:
                if buffer.size:
                    memory.free(buffer.handle, buffer.size)
                buffer.end = step
        for ref in self.swap_outs_after.get(step, ()):
            self._release(self.buffer_of[ref], step)
            size = self.swap_by_tensor[ref].resident_bytes
            if size:
                self.resident[ref] = self.memories[self.buffer_of[ref].device].allocate(size)
        for event in self.handles_after.get(step, ()):  # the swap-out runs once the producer is done
            self.host_handles[event.tensor] = memory.allocate(event.handle_bytes)

    def release_outputs(self) -> None:
        """Free the step's results, as a caller that dropped them once the pass ended."""
        for ref in dict.fromkeys(self.graph.outputs):
            buffer = self.buffer_of.get(ref)
            if buffer is not None:
                self._release(buffer, len(self.position))

    def trace(self, order: Sequence[str]) -> MemoryTrace:
        return MemoryTrace(
            order=tuple(order),
            devices=_timelines(self.timelines, self.memories, self.buffers, len(order)),
            unknown_size=tuple(self.unknown),
            buffer_of={ref: buffer.owner for ref, buffer in self.buffer_of.items()},
            lifetimes={b.owner: (b.start, b.end) for b in self.buffers if self.copy_of.get(b.owner) is not b},
        )

    def _reads(self, ref: TensorRef, late: bool) -> int:
        """Readers of `ref` that read the original (late=False) or the swapped-in copy."""
        event = self.swap_by_tensor.get(ref)
        if event is None:
            return 0 if late else len(self.graph.consumers(ref))
        cut = self.position[event.in_before]
        return sum(1 for r in self.graph.consumers(ref) if (self.position[r] >= cut) == late)

    def _read_buffer(self, ref: TensorRef, step: int) -> _Buffer | None:
        """The buffer a node at `step` reads `ref` in: the restored copy once it is back."""
        event = self.swap_by_tensor.get(ref)
        if event is not None and step >= self.position[event.in_before]:
            return self.copy_of[ref]
        return self.buffer_of.get(ref)

    def _release(self, buffer: _Buffer, step: int) -> None:
        buffer.pending -= 1
        if buffer.pending == 0 and not buffer.persistent:
            if buffer.size:
                self.memories[buffer.device].free(buffer.handle, buffer.size)
            buffer.end = step

    def _restore(self, step: int) -> list[tuple[DeviceMemory, int, int]]:
        """Bring back the copies due before `step`; returns what their restores hold besides the copies
        (device memory, handle, bytes), freed once the step is counted."""
        restoring = []
        in_branch = []  # (bytes, pieces, device) of the copies restored one at a time in a conditional
        for ref in self.swap_ins_before.get(step, ()):
            original = self.buffer_of[ref]
            event = self.swap_by_tensor[ref]
            copy = _Buffer(0 if event.in_branch else original.size, original.device, ref, False, step,
                           original.pieces)
            copy.pending = self._reads(ref, late=True)
            self.copy_of[ref] = copy
            self.buffers.append(copy)
            copy_memory = self.memories[copy.device]
            if ref in self.host_handles:  # read by the restoring node alone, freed as it finishes
                self.memories[original.device].free(self.host_handles.pop(ref), event.handle_bytes)
            if event.in_branch:
                in_branch.append((original.size + event.restore_bytes, original.pieces, copy.device))
                continue
            copy.handle = copy_memory.allocate(copy.size, copy.pieces)
            if event.restore_bytes:
                restoring.append((copy_memory, copy_memory.allocate(event.restore_bytes), event.restore_bytes))
            if ref in self.resident:
                restoring.append((copy_memory, self.resident.pop(ref), event.resident_bytes))
        if in_branch:
            size, pieces, device = max(in_branch)
            restoring.append((self.memories[device], self.memories[device].allocate(size, pieces), size))
        return restoring

    def _outputs(self, step: int, node, device: str, memory: DeviceMemory
                 ) -> tuple[list[_Buffer], list[tuple[int, _Buffer]]]:
        """Place `node`'s outputs: in an input's buffer where they are its view or overwrite it, else in new
        buffers. Returns the new buffers, and the lists a loop fills (by output index), placed with its body."""
        new_buffers, filled = [], []
        for index, info in enumerate(node.outputs):
            ref = TensorRef(node.name, index)
            size = info.size_bytes
            if size is None:
                self.unknown.append(ref)
                size = 0
            if ref in self.swap_by_tensor:
                pending = self._reads(ref, late=False) + 1 + (ref in self.graph_outputs)
            else:
                pending = len(self.graph.consumers(ref)) + (ref in self.graph_outputs)
            source = None if node.folded else view_source(node, index)  # a folded node is a Const of its own
            shared = self._read_buffer(source, step) if source is not None else None
            if shared is None and not node.folded and (node.op in INPLACE_OPS or node.op in FORWARDING_OPS):
                shared = _forwardable_input(node, _overwritable(node, index), size, self.buffer_of,
                                            self.swap_by_tensor, self.graph_outputs)
            if shared is not None:
                shared.pending += pending
                self.buffer_of[ref] = shared
                continue
            buffer = _Buffer(size, device, ref, node.persistent, step, _pieces(info, size))
            buffer.pending = pending
            self.buffer_of[ref] = buffer
            self.buffers.append(buffer)
            new_buffers.append(buffer)
            if buffer.persistent:  # on the device before the step (`sim.device_memory.instantiate`)
                continue
            if node.op in FUNCTIONAL_LOOP_OPS and buffer.pieces > 1:
                filled.append((index, buffer))
            elif size:
                buffer.handle = memory.allocate(size, buffer.pieces)
        return new_buffers, filled

    def _record(self, step: int, memory: DeviceMemory, replayed) -> None:
        """Every device's live bytes while the node at `step` runs on `memory` (a replayed loop: the most
        its iterations held)."""
        for device, other in self.memories.items():
            if device not in self.timelines:
                self.timelines[device] = ([0] * step, [0] * step)
            live, tensor_live = self.timelines[device]
            in_use, tensors = other.model.in_use_bytes, other.tensor_bytes
            if replayed is not None and other is memory:
                in_use, tensors = max(in_use, replayed.peak_in_use_bytes), max(tensors, replayed.peak_tensor_bytes)
            live.append(in_use - other.persistent_bytes)
            tensor_live.append(tensors - other.tensor_persistent_bytes)


def body_pieces(size: int) -> tuple[int, ...]:
    """`size` bytes of a body as the allocator model places them: equal pieces of about `BODY_PIECE_BYTES`
    (none for 0 bytes or less)."""
    if size <= 0:
        return ()
    count = _piece_count(size)
    return (size // count,) * (count - 1) + (size - (count - 1) * (size // count),)


def _piece_count(size: int) -> int:
    """Pieces of about `BODY_PIECE_BYTES` a body's `size` bytes are placed in (at least one)."""
    return max(1, size // BODY_PIECE_BYTES)


def _pieces(info, size: int) -> int:
    """Buffers a tensor of `size` bytes is made of: a list's elements, else one."""
    element = info.element_bytes
    return size // element if element and size > element and size % element == 0 else 1


def _overwritable(node, index: int) -> Sequence[TensorRef]:
    """The inputs of `node` whose buffer its output `index` may be written into."""
    if node.op in INPLACE_OPS:
        return node.inputs
    forwarding = FORWARDING_OPS.get(node.op)
    return (node.inputs[forwarding[0]],) if forwarding is not None and forwarding[1] == index else ()


def _forwardable_input(node, candidates, size, buffer_of, swap_by_tensor, graph_outputs) -> _Buffer | None:
    """The buffer of one of `candidates` (inputs of `node`) that `node` may overwrite: same size, not
    persistent, this node its last reader."""
    for ref in candidates:
        buffer = buffer_of[ref]
        if (
            buffer.size == size
            and size > 0
            and not buffer.persistent
            and ref not in swap_by_tensor
            and ref not in graph_outputs
            and buffer.pending == sum(1 for r in node.inputs if buffer_of[r] is buffer)
        ):
            return buffer
    return None


def _timelines(timelines, memories, buffers, steps) -> dict[str, DeviceTimeline]:
    result = {}
    for device, (values, tensor_values) in timelines.items():
        values = values + [0] * (steps - len(values))
        tensor_values = tensor_values + [0] * (steps - len(tensor_values))
        peak_step = max(range(steps), key=values.__getitem__) if steps else 0
        at_peak = [
            (b.owner, b.size)
            for b in buffers
            if b.device == device and not b.persistent and b.size and b.start <= peak_step
            and (b.end < 0 or b.end >= peak_step)
        ]
        at_peak.sort(key=lambda item: (-item[1], item[0]))
        persistent = memories[device].persistent_bytes
        result[device] = DeviceTimeline(
            device=device,
            persistent_bytes=persistent,
            live_bytes=tuple(values),
            peak_bytes=persistent + (values[peak_step] if steps else 0),
            peak_step=peak_step,
            live_at_peak=tuple(at_peak),
            tensor_persistent_bytes=memories[device].tensor_persistent_bytes,
            tensor_live_bytes=tuple(tensor_values),
        )
    return result


def _check_order(graph: Graph, order: Sequence[str], position: Mapping[str, int]) -> None:
    if len(position) != len(order) or set(position) != set(graph.nodes):
        raise ValueError("order must list every node of the graph exactly once")
    for name in order:
        for pred in graph.predecessors(name):
            if position[pred] > position[name] and not _is_loop_back_edge(graph, pred, name):
                raise ValueError(f"order runs {name!r} before its input {pred!r}")


def _is_loop_back_edge(graph: Graph, pred: str, name: str) -> bool:
    return graph.node(pred).op in LOOP_BACK_OPS and graph.node(name).op in LOOP_MERGE_OPS


def _index_swaps(graph: Graph, swaps: Iterable[SwapEvent], position: Mapping[str, int]) -> dict[TensorRef, SwapEvent]:
    by_tensor = {}
    for event in swaps:
        graph.tensor(event.tensor)
        for name in (event.out_after, event.in_before):
            if name not in position:
                raise ValueError(f"swap of {event.tensor} names node {name!r}, which is not in the graph")
        if not position[event.tensor.node] <= position[event.out_after] < position[event.in_before]:
            raise ValueError(
                f"swap of {event.tensor}: need producer <= out_after < in_before in the schedule, got "
                f"{event.tensor.node!r}@{position[event.tensor.node]}, {event.out_after!r}@{position[event.out_after]}, "
                f"{event.in_before!r}@{position[event.in_before]}"
            )
        if event.tensor in by_tensor:
            raise ValueError(f"tensor {event.tensor} is swapped twice")
        by_tensor[event.tensor] = event
    return by_tensor


def _carried_inputs(node, buffer_of, swap_by_tensor) -> tuple[int, ...]:
    """Indices of a loop node's inputs it reads last that its output of the same index replaces (same
    size, not a list that the loop fills or empties)."""
    carried = []
    for index, ref in enumerate(node.inputs[:len(node.outputs)]):
        buffer = buffer_of[ref]
        if (ref not in swap_by_tensor and buffer.pending == 1 and not buffer.persistent and buffer.size
                and buffer.size == node.outputs[index].size_bytes and node.outputs[index].passes_input is None):
            carried.append(index)
    return tuple(carried)
