"""The swap plan: what `seqmem.optimize` decided, as plain data.

A `Plan` lists every conserved tensor with its size, how it is conserved
(a kind of `seqmem.decisions.kinds`: swapped, compressed, both, or recomputed), the backward nodes
that read it back, and the trigger node after which it is restored; every loop
accumulator swapped element by element (`LoopSwap`); every vocabulary head computed
by blocks of rows (`BlockedHead`); the budget; the predicted
peak before and after; what was skipped and why. The rewriter
takes only a graph and a plan; reports read the plan. `to_json`/`from_json`
round-trip it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from seqmem.ir.graph import TensorRef
from seqmem.decisions.kinds import KINDS, LOSSY_KINDS, Kind, Swap, compressed_bytes, kind_named
from seqmem.units import MIB

__all__ = ["BLOCKED_HEAD", "COMPRESSED_DTYPES", "DEFAULT_SAFETY_MARGIN", "KINDS", "BlockedHead", "ConservationOptions",
           "LoopSwap", "SkippedCandidate", "Decision", "Plan"]

# The fraction of the budget a plan leaves for the predictor's error (`seqmem.optimize`'s safety_margin):
# it covers the error of the prediction of a pinned step on one stream (`seqmem accuracy` measures it), and
# calibration measures each plan and plans again for less where one does not fit.
DEFAULT_SAFETY_MARGIN = 0.05

# The kind that replaces a vocabulary head (projection -> sparse softmax cross-entropy, with its gradient) by a
# blocked computation (`seqmem.rewrite.vocabulary_head`); a kind of the step, not of one tensor. Opt-in: the
# kernel's and the bias's gradients are summed block by block, so they equal the original's up to float rounding.
BLOCKED_HEAD = "blocked-head"

# What a compressed float32 tensor is cast to, by the names `ConservationOptions.compression` accepts.
COMPRESSED_DTYPES = {"float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ConservationOptions:
    """What the selector may do (after the seed's and TFLMS' user options).

    kinds: the allowed `KINDS`, and `BLOCKED_HEAD` (`tensor_kinds`: those of `KINDS`). compression: the dtype compressed kinds cast float32 tensors to ("float16" or
    "bfloat16"; "fp16"/"bf16" accepted); required by, and only allowed with, a compressed kind, since it changes
    the step's numbers. min_bytes: the smallest tensor considered. min_slack_s: the shortest lifetime
    considered, seconds from its producer's completion to its first backward reader's start.
    max_decisions: the most tensors conserved (None: no limit). max_host_bytes: the most host memory the
    plan's swaps may hold (`Plan.host_bytes`; None: no limit).
    Raises ValueError naming what was wrong.
    """

    kinds: tuple[str, ...] = ("swap",)
    compression: str | None = None
    min_bytes: int = 64 << 10
    min_slack_s: float = 0.0
    max_decisions: int | None = None
    max_host_bytes: int | None = None

    def __post_init__(self) -> None:
        kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
        unknown = [kind for kind in kinds if kind not in KINDS + (BLOCKED_HEAD,)]
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty selection of {KINDS + (BLOCKED_HEAD,)}, got {self.kinds!r}")
        object.__setattr__(self, "kinds", tuple(kind for kind in KINDS + (BLOCKED_HEAD,) if kind in kinds))
        lossy = [kind for kind in self.kinds if kind in LOSSY_KINDS]
        if self.compression is not None:
            if self.compression not in COMPRESSED_DTYPES:
                raise ValueError(f"compression must be one of {sorted(COMPRESSED_DTYPES)} or None, "
                                 f"got {self.compression!r}")
            object.__setattr__(self, "compression", COMPRESSED_DTYPES[self.compression])
            if not lossy:
                raise ValueError(f"compression={self.compression!r} needs a compressed kind: add 'compress' or "
                                 f"'compress+swap' to kinds {self.kinds}")
        elif lossy:
            raise ValueError(f"kinds {lossy} change the step's numbers: say which dtype to compress to, e.g. "
                             f"compression='float16', or leave them out")
        if self.min_bytes < 0 or self.min_slack_s < 0:
            raise ValueError(f"min_bytes and min_slack_s must be >= 0, got {self.min_bytes!r}, {self.min_slack_s!r}")
        if self.max_decisions is not None and (not isinstance(self.max_decisions, int) or self.max_decisions < 0):
            raise ValueError(f"max_decisions must be a non-negative int or None, got {self.max_decisions!r}")
        if self.max_host_bytes is not None and (not isinstance(self.max_host_bytes, int) or self.max_host_bytes < 0):
            raise ValueError(f"max_host_bytes must be a non-negative int or None, got {self.max_host_bytes!r}")

    @property
    def tensor_kinds(self) -> tuple[str, ...]:
        """The allowed kinds a single tensor is conserved by (`KINDS`)."""
        return tuple(kind for kind in self.kinds if kind in KINDS)

    @property
    def blocked_head(self) -> bool:
        """Whether a vocabulary head may be replaced by its blocked computation (`BLOCKED_HEAD`)."""
        return BLOCKED_HEAD in self.kinds

    def describe(self) -> str:
        """One line for `Plan.summary`: "options: kinds swap, recompute; tensors of at least 65536 bytes"."""
        limits = [f"kinds {', '.join(self.kinds)}"]
        if self.compression:
            limits.append(f"compression to {self.compression}")
        limits.append(f"tensors of at least {self.min_bytes} bytes")
        if self.min_slack_s:
            limits.append(f"living at least {1e3 * self.min_slack_s:.3f} ms")
        if self.max_decisions is not None:
            limits.append(f"at most {self.max_decisions} of them")
        if self.max_host_bytes is not None:
            limits.append(f"at most {self.max_host_bytes / MIB:.1f} MB in host memory")
        return "options: " + "; ".join(limits)


@dataclass(frozen=True)
class Decision:
    """Conserve `tensor` after its forward readers, and restore it before `consumers`.

    kind: how (`seqmem.decisions.kinds`: `Swap`, `Recompute`, `Compress`, `CompressAndSwap`).
    consumers: the backward nodes that read the restored copy.
    trigger: the node whose completion starts the restoration (a control edge).
    transfer_s: predicted seconds of one device<->host copy of what moves (0 when nothing does).
    cost_s: predicted seconds the kind adds to the step: transfer time not hidden by computation, the
    casts, the recomputation.
    handle_bytes: device bytes the host copy keeps on the device until it is restored
    (`MachineModel.host_handle_bytes`; 0 for kinds that move nothing to the host).
    in_branch: the one consumer is a conditional, which takes the host copy as its input and restores it in
    its branches just before a branch reads it, one such copy at a time (`seqmem.edge.branch_restores`).
    """

    tensor: TensorRef
    size_bytes: int
    consumers: tuple[str, ...]
    trigger: str
    transfer_s: float
    kind: Kind = Swap()
    cost_s: float = 0.0
    handle_bytes: int = 0
    in_branch: bool = False

    @property
    def compressed_bytes(self) -> int:
        """Bytes of the tensor cast to a 16-bit type (half, rounded up)."""
        return compressed_bytes(self.size_bytes)

    @property
    def resident_bytes(self) -> int:
        """Bytes the tensor keeps on the device between its uses."""
        return self.kind.resident_bytes(self.size_bytes)

    @property
    def saved_bytes(self) -> int:
        return self.size_bytes - self.resident_bytes

    @property
    def host_bytes(self) -> int:
        """Bytes the tensor holds in host memory between its uses."""
        return self.kind.host_bytes(self.size_bytes)

    @property
    def precision(self) -> str:
        """"exact", or the dtype the tensor's values are rounded to."""
        return self.kind.precision

    def to_dict(self) -> dict:
        """The decision as JSON data: the kind by name, with the dtype it compresses to and the nodes it
        re-runs."""
        kind = self.kind
        return {"tensor": str(self.tensor), "size_bytes": self.size_bytes, "consumers": list(self.consumers),
                "trigger": self.trigger, "transfer_s": self.transfer_s, "kind": kind.name, "cost_s": self.cost_s,
                "compressed_dtype": getattr(kind, "dtype", None), "recompute": list(getattr(kind, "nodes", ())),
                "handle_bytes": self.handle_bytes, "in_branch": self.in_branch}

    @classmethod
    def from_dict(cls, data: dict) -> "Decision":
        kind = kind_named(data.get("kind", "swap"), data.get("compressed_dtype"), tuple(data.get("recompute", ())))
        return cls(TensorRef.parse(data["tensor"]), data["size_bytes"], tuple(data["consumers"]), data["trigger"],
                   data["transfer_s"], kind=kind, cost_s=data.get("cost_s", 0.0),
                   handle_bytes=data.get("handle_bytes", 0), in_branch=data.get("in_branch", False))


@dataclass(frozen=True)
class LoopSwap:
    """A loop accumulator (TensorList) whose elements go to host memory one per iteration
    (`seqmem.edge.loop_swap`).

    accumulator: its `EmptyTensorList` node; forward_loop/gradient_loop: the While nodes that fill and
    empty it, forward_index/gradient_index: its loop-variable index in each. dtype, element_shape (None
    where unknown: a dimension, or the whole shape) and element_bytes (None unless the shape is fully
    known): one element, i.e. what one iteration saves. buffer: the forward body's tensor whose buffer
    each element is (a view's source, or the value a loop variable carries from the previous iteration);
    accumulators of one loop that save the same buffer free it only together. None: not known.
    """

    accumulator: str
    forward_loop: str
    forward_index: int
    gradient_loop: str
    gradient_index: int
    dtype: str
    element_shape: tuple[int | None, ...] | None
    element_bytes: int | None
    buffer: str | None = None

    @property
    def tensor(self) -> TensorRef:
        """The full list, as the forward loop outputs it and the gradient loop reads it."""
        return TensorRef(self.forward_loop, self.forward_index)


@dataclass(frozen=True)
class BlockedHead:
    """A vocabulary head replaced by its blocked computation (`seqmem.rewrite.vocabulary_head`): its
    cross-entropy node, the logits' [rows, vocabulary] from features of `hidden` units, the row blocks,
    the bytes of one [rows, vocabulary] tensor, and the predicted seconds the recomputed projection adds."""

    loss: str
    rows: int
    hidden: int
    vocabulary: int
    blocks: int
    logits_bytes: int
    cost_s: float


@dataclass(frozen=True)
class SkippedCandidate:
    """A feature map the selector did not swap, and why."""

    tensor: TensorRef
    size_bytes: int
    reason: str


@dataclass(frozen=True)
class Plan:
    """The optimizer's decisions; sizes in bytes, times in seconds.

    budget_bytes: the caller's budget; target_bytes: the peak the selector
    planned for (below the budget by `optimize`'s safety margin, or lower
    after calibration measured more than predicted).
    feasible: predicted_peak_after_bytes <= budget_bytes.
    predicted_overhead_s: transfer time the schedule cannot hide behind compute.
    measured_peak_bytes: the optimized step's peak measured on the device, when
    `optimize` calibrated it.
    pinned_order: the order the rewritten step is pinned to (`seqmem.rewrite.pin`),
    swap nodes aside; empty when it is not pinned.
    split_barriers: the `IdentityN` joins removed before anything else, so that
    each variable's update runs once its own gradient exists
    (`seqmem.ir.barriers`); the plan's tensors and order are those of the
    graph without them.
    loop_parallel_iterations: the most iterations any while loop of the step
    runs at once (`seqmem.edge.loops`); None: loops as traced.
    loop_swaps: loop accumulators swapped element by element; each loop then
    holds at most `loop_parallel_iterations` of their elements on the device.
    loop_swapped_bytes: the device bytes their full lists held.
    blocked_heads: vocabulary heads replaced by their blocked computation; the plan's tensors and order
    are those of the graph with them replaced (their cost is in `predicted_overhead_s`).
    options: what the selector was allowed to do.
    """

    budget_bytes: int
    target_bytes: int
    predicted_peak_before_bytes: int
    predicted_peak_after_bytes: int
    decisions: tuple[Decision, ...] = ()
    skipped: tuple[SkippedCandidate, ...] = ()
    predicted_overhead_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    measured_peak_bytes: int | None = None
    pinned_order: tuple[str, ...] = ()
    split_barriers: tuple[str, ...] = ()
    loop_parallel_iterations: int | None = None
    loop_swaps: tuple[LoopSwap, ...] = ()
    loop_swapped_bytes: int = 0
    blocked_heads: tuple[BlockedHead, ...] = ()
    options: ConservationOptions = ConservationOptions()

    @property
    def feasible(self) -> bool:
        return self.predicted_peak_after_bytes <= self.budget_bytes

    @property
    def saved_bytes(self) -> int:
        """Device bytes the decisions free between their tensors' uses."""
        return sum(d.saved_bytes for d in self.decisions)

    @property
    def host_bytes(self) -> int:
        """Host memory the plan's swaps hold at most: every swapped tensor and every swapped loop list at
        once, as at the turn from forward to backward (an upper bound)."""
        return sum(d.host_bytes for d in self.decisions) + self.loop_swapped_bytes

    def summary(self) -> str:
        """A readable table of the plan."""
        lines = [
            f"budget {self.budget_bytes / MIB:.1f} MB (planned for {self.target_bytes / MIB:.1f} MB); predicted peak {self.predicted_peak_before_bytes / MIB:.1f} MB "
            f"-> {self.predicted_peak_after_bytes / MIB:.1f} MB ({'fits' if self.feasible else 'does NOT fit'})",
            f"{len(self.decisions)} tensors conserved ({self.saved_bytes / MIB:.1f} MB freed: {self._kind_counts()}), "
            f"predicted overhead {1e3 * self.predicted_overhead_s:.2f} ms; {len(self.skipped)} candidates skipped; "
            f"host memory {self.host_bytes / MIB:.1f} MB at most",
            self.options.describe(),
        ]
        if self.loop_swaps:
            loops = len({swap.forward_loop for swap in self.loop_swaps})
            lines.append(f"{len(self.loop_swaps)} loop accumulators of {loops} loop(s) swapped element by element "
                         f"({self.loop_swapped_bytes / MIB:.1f} MB; prefetch depth "
                         f"{self.loop_parallel_iterations} iteration(s))")
        for head in self.blocked_heads:
            lines.append(f"vocabulary head {head.loss} blocked: [{head.rows}, {head.vocabulary}] logits "
                         f"({head.logits_bytes / MIB:.1f} MB) in {head.blocks} row blocks, recomputed in backward "
                         f"(predicted {1e3 * head.cost_s:.2f} ms)")
        if self.split_barriers:
            lines.append(f"updates run as their gradients come: {len(self.split_barriers)} gradient barrier(s) split "
                         f"(see seqmem.ir.barriers)")
        if self.pinned_order:
            lines.append(f"pinned to its planned order ({len(self.pinned_order)} nodes; see seqmem.rewrite.pin)")
        if self.loop_parallel_iterations is not None:
            lines.append(f"while loops run at most {self.loop_parallel_iterations} iteration(s) at once "
                         f"(see seqmem.edge.loops)")
        if self.measured_peak_bytes is not None:
            lines.append(f"measured peak {self.measured_peak_bytes / MIB:.1f} MB")
        lines += list(self.notes)
        if self.decisions:
            lines.append(f"{'MB':>8}  {'saved MB':>8}  {'cost ms':>8}  {'kind':<13}  {'precision':<9}  tensor -> trigger")
            for d in self.decisions:
                lines.append(f"{d.size_bytes / MIB:8.2f}  {d.saved_bytes / MIB:8.2f}  {1e3 * d.cost_s:8.3f}  "
                             f"{d.kind.name:<13}  {d.precision:<9}  {d.tensor} -> {d.trigger}")
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

    def _kind_counts(self) -> str:
        counts = {kind: sum(d.kind.name == kind for d in self.decisions) for kind in KINDS}
        return ", ".join(f"{count} {kind}" for kind, count in counts.items() if count) or "none"

    def to_json(self) -> str:
        data = asdict(self)
        data["decisions"] = [decision.to_dict() for decision in self.decisions]
        for item in data["skipped"]:
            item["tensor"] = str(TensorRef(*item["tensor"]))
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = json.loads(text)
        decisions = tuple(Decision.from_dict(d) for d in data.pop("decisions"))
        skipped = tuple(SkippedCandidate(**{**s, "tensor": TensorRef.parse(s["tensor"])}) for s in data.pop("skipped"))
        loop_swaps = tuple(
            LoopSwap(**{**s, "element_shape": None if s["element_shape"] is None else tuple(s["element_shape"])})
            for s in data.pop("loop_swaps", ())
        )
        blocked_heads = tuple(BlockedHead(**head) for head in data.pop("blocked_heads", ()))
        options = data.pop("options", None)
        options = ConservationOptions() if options is None else ConservationOptions(
            **{**options, "kinds": tuple(options["kinds"])})
        return cls(**{**data, "notes": tuple(data.get("notes", ())), "pinned_order": tuple(data.get("pinned_order", ())),
                      "split_barriers": tuple(data.get("split_barriers", ()))},
                   decisions=decisions, skipped=skipped, loop_swaps=loop_swaps, blocked_heads=blocked_heads,
                   options=options)
