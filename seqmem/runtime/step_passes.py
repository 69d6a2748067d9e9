"""The passes that make the GraphDef an optimized step runs, declared in the order they run.

`rewrite` and `assign_in_place` edit seqmem's IR (conservations, pinned order,
variables kept in place); the passes below edit the exported GraphDef, because
they change loop bodies, branches and called functions, which the IR holds as an
opaque library. Each `StepPass` says when it applies to a plan; `run_passes` runs
those that do, in order, and returns the result with the names of the passes
that changed it (after torch.fx's `PassManager`); `check` sees the GraphDef
after each pass (tests import it into a graph).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from tensorflow.core.framework import graph_pb2

from seqmem.analyze.analysis import StepAnalysis
from seqmem.edge import capture
from seqmem.edge.branch_restores import restore_in_branches
from seqmem.edge.gates import gate_loops
from seqmem.edge.in_place import assign_in_place
from seqmem.edge.loop_swap import swap_loop_accumulators
from seqmem.edge.loops import bound_loops
from seqmem.edge.pinned_bodies import pin_branches, pin_loop_bodies
from seqmem.edge.unpacked_splits import unpack_splits
from seqmem.edge.variable_shapes import variable_shapes
from seqmem.decisions.plan import Plan
from seqmem.rewrite.conservations import SwapBackend, rewrite

__all__ = ["STEP_PASSES", "PassesResult", "StepPass", "rewritten_graph_def", "run_passes"]


@dataclass(frozen=True)
class StepPass:
    """A pass over a rewritten step's GraphDef: `run(graph_def, plan, analysis)` returns the GraphDef it
    makes; it runs where `applies(plan)`."""

    name: str
    applies: Callable[[Plan], bool]
    run: Callable[[graph_pb2.GraphDef, Plan, StepAnalysis], graph_pb2.GraphDef]


@dataclass(frozen=True)
class PassesResult:
    """The GraphDef the passes made, and the names of those that changed it, in the order they ran."""

    graph_def: graph_pb2.GraphDef
    changed: tuple[str, ...]


def _bounded(plan: Plan) -> bool:
    return plan.loop_parallel_iterations is not None


STEP_PASSES: tuple[StepPass, ...] = (
    # a pinned step's conditionals run their branches in the order the simulator charged them for
    # (`edge.pinned_bodies`), before restores are moved into them
    StepPass("pin branches", lambda plan: bool(plan.pinned_order),
             lambda graph_def, plan, analysis: pin_branches(graph_def, variable_shapes(analysis.graph))),
    # swapped tensors a conditional reads, restored in its branches one at a time (`edge.branch_restores`)
    StepPass("restore in branches", lambda plan: any(decision.in_branch for decision in plan.decisions),
             lambda graph_def, plan, analysis: restore_in_branches(graph_def)),
    # what a forward loop saves for its gradient loop, swapped element by element (`edge.loop_swap`)
    StepPass("swap loop accumulators", lambda plan: bool(plan.loop_swaps),
             lambda graph_def, plan, analysis: swap_loop_accumulators(graph_def, plan.loop_swaps)),
    # every while loop runs at most the plan's iterations at once (`edge.loops`)
    StepPass("bound loops", _bounded,
             lambda graph_def, plan, analysis: bound_loops(graph_def, plan.loop_parallel_iterations)),
    # a loop starts once every input it reads exists, as the simulator runs it (`edge.gates`)
    StepPass("gate loops", _bounded, lambda graph_def, plan, analysis: gate_loops(graph_def)),
    # wide splits allocate their outputs one after another (`edge.unpacked_splits`)
    StepPass("unpack splits", lambda plan: True, lambda graph_def, plan, analysis: unpack_splits(graph_def)),
    # loop bodies run in the order the simulator charged them for (`edge.pinned_bodies`)
    StepPass("pin loop bodies", lambda plan: plan.loop_parallel_iterations == 1,
             lambda graph_def, plan, analysis: pin_loop_bodies(graph_def, variable_shapes(analysis.graph))),
)


def run_passes(graph_def: graph_pb2.GraphDef, plan: Plan, analysis: StepAnalysis,
               passes: Sequence[StepPass] = STEP_PASSES,
               check: Optional[Callable[[str, graph_pb2.GraphDef], None]] = None) -> PassesResult:
    """`passes` that apply to `plan`, run in order on `graph_def`; `check(name, graph_def)` after each. A pass
    changed the GraphDef where it returned another one with other bytes."""
    changed = []
    for step_pass in passes:
        if not step_pass.applies(plan):
            continue
        result = step_pass.run(graph_def, plan, analysis)
        if result is not graph_def and _serialized(result) != _serialized(graph_def):
            changed.append(step_pass.name)
        if check is not None:
            check(step_pass.name, result)
        graph_def = result
    return PassesResult(graph_def, tuple(changed))


def _serialized(graph_def: graph_pb2.GraphDef) -> bytes:
    """`graph_def`'s bytes, to compare two GraphDefs by (proto equality fails on a NaN constant)."""
    return graph_def.SerializeToString(deterministic=True)


def rewritten_graph_def(analysis: StepAnalysis, plan: Plan, backend: SwapBackend,
                        check: Optional[Callable[[str, graph_pb2.GraphDef], None]] = None) -> PassesResult:
    """The GraphDef the step rewritten by `plan` runs: the IR rewritten and its variables kept in place,
    exported, then `STEP_PASSES`."""
    graph_def = capture.to_graph_def(assign_in_place(rewrite(analysis.graph, plan, backend)))
    return run_passes(graph_def, plan, analysis, check=check)
