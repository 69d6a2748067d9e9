"""The tensors the selector may conserve, each with the ways it can be conserved and what each costs.

First the forward feature maps, longest-lived first (by critical-path distance
to the loss); then the backward tensors that wait on the device for a later
reader (`_held_tensors`: gradients waiting for a join, such as a data-parallel
step's all-reduce pack or a global-norm clip). Tensors below a size threshold
or living too briefly (`ConservationOptions`), and tensors that share their
buffer with another tensor read after them, are skipped, each with its reason.
A kind that does not apply (a swap whose transfer cannot hide, a compression of
a non-float32 tensor) is left out of a candidate's options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from seqmem.analyze.analysis import StepAnalysis
from seqmem.analyze.anatomy import StepAnatomy
from seqmem.analyze.critical_path import MachineModel, transfer_time_s
from seqmem.ir.graph import Graph, TensorRef
from seqmem.ir.op_tables import FUNCTIONAL_COND_OPS, RECOMPUTABLE_OPS, SHAPE_OPS
from seqmem.ir.regrouped import regrouped_pairs
from seqmem.plan.events import restore_bytes
from seqmem.plan.readers import backward_content_readers, kept_until, last_early_reader
from seqmem.sim.trace import MemoryTrace
from seqmem.decisions.kinds import HOST_KINDS, LOSSY_KINDS, Recompute, compressed_bytes, kind_named
from seqmem.decisions.plan import ConservationOptions, SkippedCandidate, Decision
from seqmem.plan.triggers import TriggerIndex

__all__ = ["Candidate", "Option", "conservation_candidates"]


@dataclass(frozen=True)
class Option:
    """One way to conserve a candidate: its decision, the schedule position it is restored at (the
    tensor is off the device at positions out_pos < i < off_until), the bytes the device holds at in_pos
    besides the copy, and the tensors a recomputation reads (they must stay on the device)."""

    decision: Decision
    in_pos: int
    restore_bytes: int
    reads: frozenset[TensorRef] = frozenset()

    @property
    def off_until(self) -> int:
        """The first position the tensor is on the device again: in_pos, or the one after it where a
        conditional restores it in its branches (the conditional holds one such copy at a time)."""
        return self.in_pos + 1 if self.decision.in_branch else self.in_pos


@dataclass(frozen=True)
class Candidate:
    """A feature map the selector may conserve, after its last forward reader at `out_pos`, in any of `options`."""

    tensor: TensorRef
    out_pos: int
    options: tuple[Option, ...]


def conservation_candidates(analysis: StepAnalysis, trace: MemoryTrace, machine: MachineModel, options: ConservationOptions,
                position: Mapping[str, int], loop_swapped: set[TensorRef]):
    """Feature maps worth trying, longest-lived first, each with the kinds that can conserve it; and the skipped."""
    graph, anatomy, timing = analysis.graph, analysis.anatomy, analysis.timing
    triggers = TriggerIndex(graph, timing, anatomy.backward, position)
    regrouped = regrouped_pairs(graph)
    aliases: dict[TensorRef, list[TensorRef]] = {}
    for tensor, owner in trace.buffer_of.items():
        aliases.setdefault(owner, []).append(tensor)
    distance = timing.distance_to_loss_s
    ordered = sorted(anatomy.feature_maps, key=lambda r: (-distance.get(r.node, 0.0), position[r.node], r.index))
    held = _held_tensors(graph, anatomy, trace, position)
    candidates, skipped = [], []
    for ref in ordered + list(held):
        size = graph.tensor(ref).size_bytes
        if ref in loop_swapped:
            skipped.append(SkippedCandidate(ref, size or 0, "a loop accumulator swapped element by element"))
            continue
        if size is None or size < options.min_bytes:
            skipped.append(SkippedCandidate(ref, size or 0, f"smaller than {options.min_bytes} bytes"))
            continue
        if ref in held:
            found = _held_span(graph, ref, held[ref], aliases.get(trace.buffer_of.get(ref), ()), position)
        else:
            found = _feature_map_span(graph, ref, anatomy, aliases.get(trace.buffer_of.get(ref), ()), position)
        if isinstance(found, str):
            skipped.append(SkippedCandidate(ref, size, found))
            continue
        consumers, out_pos = found
        slack = timing.start_s[consumers[0]] - timing.completion_s[ref.node]
        if slack < options.min_slack_s:
            skipped.append(SkippedCandidate(ref, size, f"lives {1e3 * slack:.3f} ms, under min_slack_s"))
            continue
        kinds, reasons = [], []
        for kind in options.tensor_kinds:
            for late in _restore_timings(kind, machine):
                option = _option(kind, analysis, ref, size, consumers, out_pos, position, triggers, machine,
                                 options, regrouped, late)
                if isinstance(option, str):
                    reasons.append(option)
                elif all(option.decision.trigger != other.decision.trigger or other.decision.kind.name != kind
                         for other in kinds):
                    kinds.append(option)
        if kinds:
            candidates.append(Candidate(ref, out_pos, tuple(kinds)))
        else:
            skipped.append(SkippedCandidate(ref, size, "; ".join(dict.fromkeys(reasons))))
    return candidates, skipped



def _held_tensors(graph: Graph, anatomy: StepAnatomy, trace: MemoryTrace, position: Mapping[str, int]
                  ) -> dict[TensorRef, tuple[str, ...]]:
    """Backward tensors that wait on the device for a later reader, each with its readers after the gap in
    the order between its producer and the readers of its contents where the baseline `trace` holds the
    most bytes (of those, the widest, then the first), in the order of their producers. A gradient waiting
    for a join is one: the concatenation a data-parallel step's all-reduce packs every gradient into,
    `clip_by_global_norm`'s scaling after the norm of every gradient, a loss-scale optimizer's update after
    the finite check of every gradient. A gap must hold a node (a trigger for the restore). Of tensors
    sharing one buffer, only the one read last; graph outputs (returned to the caller) and tensors in
    persistent buffers are not held."""
    outputs = set(graph.outputs)
    live = trace.busiest().tensor_live_bytes
    held: dict[TensorRef, tuple[str, ...]] = {}
    last_read: dict[TensorRef, tuple[int, TensorRef]] = {}  # by buffer: the tensor read last, and when
    for name in sorted(anatomy.backward, key=position.__getitem__):
        node = graph.node(name)
        if node.persistent:
            continue
        for index in range(len(node.outputs)):
            ref = TensorRef(name, index)
            readers = sorted({r for r in graph.consumers(ref) if graph.node(r).op not in SHAPE_OPS},
                             key=position.__getitem__)
            if not readers or ref in outputs:
                continue
            points = [position[name]] + [position[r] for r in readers]
            gaps = [i for i in range(len(readers)) if points[i + 1] - points[i] >= 2]  # gap i: before readers[i]
            if not gaps:
                continue
            gap = gaps[0] if len(gaps) == 1 else max(gaps, key=lambda i: (
                max(live[points[i] + 1:points[i + 1]]), points[i + 1] - points[i], -i))
            buffer = trace.buffer_of.get(ref, ref)
            if graph.node(buffer.node).persistent:
                continue
            held[ref] = tuple(readers[gap:])
            if buffer not in last_read or last_read[buffer][0] < points[-1]:
                last_read[buffer] = (points[-1], ref)
    kept = {ref for _, ref in last_read.values()}
    return {ref: readers for ref, readers in held.items() if ref in kept}



def _feature_map_span(graph: Graph, ref: TensorRef, anatomy: StepAnatomy, aliases: Sequence[TensorRef],
                      position: Mapping[str, int]) -> tuple[tuple[str, ...], int] | str:
    """A feature map's backward readers of its contents (sorted by position) and the position after which
    it may leave the device (its and its aliases' last forward reader); or why it cannot."""
    # forward-time aliases only: a backward op writing in place into this buffer would, after the
    # rewrite, write into the restored copy instead
    sharing = [a for a in aliases if a != ref and a.node not in anatomy.backward]
    if any(backward_content_readers(graph, a, anatomy, position) for a in sharing):
        return "shares its buffer with another tensor read in backward"
    consumers = backward_content_readers(graph, ref, anatomy, position)
    if not consumers:
        return "no backward op reads its contents"
    return consumers, max(position[last_early_reader(graph, a, consumers if a == ref else (), position)]
                          for a in [ref, *sharing])


def _held_span(graph: Graph, ref: TensorRef, late_readers: tuple[str, ...], aliases: Sequence[TensorRef],
               position: Mapping[str, int]) -> tuple[tuple[str, ...], int] | str:
    """A held backward tensor's late readers and the position after which it may leave the device (its
    other readers', and every reader of the tensors sharing its buffer before the late readers run: a late
    reader writing in place would, after the rewrite, write into the restored copy); or why it cannot."""
    first_late = position[late_readers[0]]
    early = [r for r in graph.consumers(ref) if r not in late_readers]
    early += [r for a in aliases if a != ref and position[a.node] < first_late for r in graph.consumers(a)]
    out_pos = max([position[ref.node]] + [position[r] for r in early])
    if out_pos >= first_late:
        return "a tensor sharing its buffer is read until its late readers run"
    return late_readers, out_pos


def _restore_timings(kind: str, machine: MachineModel) -> tuple[bool, ...]:
    """When a copy of `kind` may be restored: early enough to hide its transfer (False), and also right
    after the last backward node before its first reader in the order the step runs in (True), which keeps
    the restored copy off the device in between: what a tight budget needs when early restores set the
    peak. Where copies overlap computation a late restore costs the transfer; where they do not, "early"
    is when the ASAP estimate says the first reader starts, which on one stream can be many nodes
    before it runs."""
    return (False, True) if kind in HOST_KINDS else (False,)


def _option(kind: str, analysis: StepAnalysis, ref: TensorRef, size: int, consumers: tuple[str, ...], out_pos: int,
            position: Mapping[str, int], triggers: TriggerIndex, machine: MachineModel,
            options: ConservationOptions, regrouped: frozenset[str], late: bool = False) -> Option | str:
    """How `kind` would conserve `ref`, or why it cannot; `late`: restored just before its first reader
    (see `_restore_timings`). regrouped: the sums and products Grappler regroups (`ir.regrouped`), which no recomputed
    chain holds: its copies wait for their trigger, and Grappler would round them otherwise."""
    graph, timing = analysis.graph, analysis.timing
    first_use_s = timing.start_s[consumers[0]]
    if kind in LOSSY_KINDS and graph.tensor(ref).dtype != "float32":
        return f"{graph.tensor(ref).dtype}: only float32 tensors are compressed"
    reads: frozenset[TensorRef] = frozenset()
    chain: tuple[str, ...] = ()
    if kind == "recompute":
        found = _recompute_chain(analysis, ref, position[consumers[0]], position)
        if found is None:
            return "not a chain of cheap ops over tensors the device keeps anyway"
        chain, reads = found
        if regrouped.intersection(chain):
            return "its chain holds sums or products Grappler regroups in the original"
    conserved = kind_named(kind, options.compression, chain)
    lossy = conserved.precision != "exact"
    cast_s = (size + compressed_bytes(size)) / machine.memory_bytes_per_s  # one cast, either way
    transfer_s = transfer_time_s(conserved.host_bytes(size), machine)
    if isinstance(conserved, Recompute):
        lead_s = sum(timing.completion_s[name] - timing.start_s[name] for name in chain)
    else:  # a copy that cannot overlap computation gains nothing by starting early: restore just in time
        lead_s = (transfer_s if machine.copies_overlap else 0.0) + (cast_s if lossy else 0.0)
    in_branch = conserved.to_host and len(consumers) == 1 and graph.node(consumers[0]).op in FUNCTIONAL_COND_OPS
    if late or in_branch:  # a conditional restores it in its branches, as it runs
        trigger, hidden = triggers.last_before(consumers), False
    else:
        trigger, hidden = triggers.choose(consumers, lead_s)
    if trigger is None or position[trigger] <= out_pos:
        return "consumed almost immediately: no step between its uses"
    if conserved.to_host and machine.copies_overlap and (late or not hidden) \
            and first_use_s - timing.completion_s[ref.node] < lead_s:
        return "backward use follows within the transfer time"
    if isinstance(conserved, Recompute):
        cost_s = lead_s
    elif not conserved.to_host:  # compressed on the device: a cast each way
        cost_s = 2 * cast_s
    else:
        if machine.copies_overlap:
            copy_s = max(0.0, timing.completion_s[trigger] + lead_s - first_use_s)  # what computation does not hide
        else:
            copy_s = 2 * transfer_s  # out and in, on the compute's own time
        cost_s = copy_s + (2 * cast_s if lossy else 0.0)
    decision = Decision(ref, size, consumers, trigger, transfer_s, kind=conserved, cost_s=cost_s,
                        handle_bytes=machine.host_handle_bytes if conserved.to_host else 0, in_branch=in_branch)
    in_pos = position[consumers[0]] if in_branch else position[trigger] + 1
    return Option(decision, in_pos, restore_bytes(graph, decision), reads)


def _recompute_chain(analysis: StepAnalysis, ref: TensorRef, deadline: int, position: Mapping[str, int],
                     depth: int = 3) -> tuple[tuple[str, ...], frozenset[TensorRef]] | None:
    """The forward nodes (in order) that recompute `ref` from tensors the device keeps until `deadline` (a
    schedule position) anyway, and those tensors; None when `ref` is not such a chain of at most `depth`
    `RECOMPUTABLE_OPS`."""
    graph = analysis.graph
    node = graph.node(ref.node)
    if node.op not in RECOMPUTABLE_OPS or node.name in analysis.anatomy.backward:
        return None
    chain: dict[str, None] = {}
    reads: set[TensorRef] = set()
    for source in node.inputs:
        if kept_until(graph, source, position) >= deadline:
            reads.add(source)
            continue
        inner = _recompute_chain(analysis, source, deadline, position, depth - 1) if depth > 1 else None
        if inner is None:
            return None
        chain.update(dict.fromkeys(inner[0]))
        reads |= inner[1]
    chain[node.name] = None
    return tuple(chain), frozenset(reads)
