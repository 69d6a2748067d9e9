"""Building the runnable step: a rewritten GraphDef run with the original function's inputs and variables.

The rewritten GraphDef is imported into a `tf.compat.v1.wrap_function` with the
original variable handles mapped in, so variables update in place (assignments
too: `seqmem.edge.in_place`).
"""

from __future__ import annotations

import gc
import logging
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem.analyze.analysis import StepAnalysis
from seqmem.edge import capture
from seqmem.edge.collectives import local_graph_def
from seqmem.edge.library import nodes_running, variable_writers
from seqmem.edge.runner import IMPORT_SCOPE, graph_def_runner
from seqmem.runtime.step_passes import rewritten_graph_def
from seqmem.runtime.workers import Workers, failure_line
from seqmem.errors import InfeasibleBudgetError
from seqmem.ir.op_tables import FUNCTIONAL_LOOP_OPS
from seqmem.decisions.plan import Plan
from seqmem.rewrite.conservations import SWAP_MARK, SwapBackend
from seqmem.units import MIB

__all__ = ["OptimizedStep", "build_step"]

# a swap-in's ParseTensor, in the step (`seqmem.rewrite.conservations`) or in a loop body (`seqmem.edge.loop_swap`)
_PARSE_FAILED = re.compile(r"Cannot parse tensor from proto:.*\[\[\{\{node ([^}]*(?:"
                           + SWAP_MARK + r"[^}]*/parse|/seqmem_parse))\}\}\]\]", re.DOTALL)
_FAILED_NODE = re.compile(r"\[\[(?:\{\{node )?([^\]{}]+)(?:\}\})?\]\]")  # [[{{node a}}]], [[a]]: the node, its callers

_log = logging.getLogger(__name__)


class OptimizedStep:
    """A training step rewritten to fit a budget; call it like the original.

    graph_def: the rewritten graph. plan: what was swapped and why (see Plan).
    analysis: the analysis of the original step the plan was made on.
    function: the original ConcreteFunction, original: what the caller passed
    (a tf.function or `function`; None: run `graph_def` even where the plan
    changes nothing); both None for graph targets.
    backend: the swap nodes' placement the graph was rewritten with.
    replan: when set (by `seqmem.optimize`), the plan to run instead of `plan`
    after a call ran out of memory (raises InfeasibleBudgetError when there is
    none). Used once, and only where the failed call ran no variable update.
    workers: for a step of several `tf.distribute` workers (`seqmem.runtime.workers`),
    whose collectives a call that runs out of memory aborts; None otherwise.
    """

    def __init__(self, analysis: StepAnalysis, plan: Plan, graph_def: graph_pb2.GraphDef, backend: SwapBackend,
                 function=None, original=None) -> None:
        self.analysis = analysis
        self.plan = plan
        self.graph_def = graph_def
        self.backend = backend
        self.function = function
        self.original = original
        self.replan: Optional[Callable[[Plan], Plan]] = None
        self.workers: Optional[Workers] = None
        self._run = None
        if function is not None:
            unchanged = (not plan.decisions and not plan.loop_swaps and not plan.pinned_order
                         and not plan.split_barriers and plan.loop_parallel_iterations is None and not plan.blocked_heads)
            self._run = original if unchanged and original is not None else graph_def_runner(function, graph_def)

    def __call__(self, *args: Any) -> Any:
        """Run the step. When the device runs out of memory (also where a swap-in on the emulated device
        reports it as a tensor it cannot parse): the first time, if `replan` is set and the failed node came
        before every variable update (`_ran_no_variable_update`), re-plan, log one line and run the call
        again; otherwise raise ResourceExhaustedError with the plan's prediction."""
        if self._run is None:
            raise TypeError("this step came from a graph: run .graph_def in a tf.compat.v1.Session")
        try:
            if self._run is self.original:
                return self._run(*args)
            outputs = self._run(*tf.nest.flatten(args))
            return tf.nest.pack_sequence_as(self.function.structured_outputs, outputs)
        except tf.errors.ResourceExhaustedError as error:
            failure, message = error, error.message
        except tf.errors.InvalidArgumentError as error:
            restoring = _PARSE_FAILED.search(error.message)
            if restoring is None:
                raise
            # ParseTensor makes its output with Tensor::FromProto, which reports a failed allocation as a
            # proto it cannot parse (and quotes the whole tensor)
            failure = error
            message = f"OOM restoring a swapped tensor in {restoring.group(1)} (ParseTensor could not allocate it)"
        note = f"the plan predicted a peak of {self.plan.predicted_peak_after_bytes / MIB:.1f} MB " \
               f"for a budget of {self.plan.budget_bytes / MIB:.1f} MB"
        failed = _failed_nodes(failure.message)
        if self.workers is not None:
            self.workers.abort(f"out of memory ({failure_line(message)})")
        if self.replan is not None and _ran_no_variable_update(self.graph_def, failed):
            replan, self.replan = self.replan, None
            try:
                plan = replan(self.plan)
            except InfeasibleBudgetError as error:
                note += f"; re-planning for less found nothing: {error}"
            else:
                self._adopt(plan)
                _log.warning("seqmem: the step ran out of memory (%s); re-planned for %.1f MB, predicted %.1f MB "
                             "(%d tensors conserved, %d loop lists swapped); running it again",
                             failed[0], plan.target_bytes / MIB,
                             plan.predicted_peak_after_bytes / MIB, len(plan.decisions), len(plan.loop_swaps))
                return self(*args)
        raise tf.errors.ResourceExhaustedError(failure.node_def, failure.op, f"{message}\nseqmem: {note}") from None

    def restart(self) -> None:
        """Instantiate the rewritten step anew: its stateful kernels (random ops seeded per op, as Keras'
        dropout draws) start again from their seeds, as the original's do before its first call. Calibration
        calls it first; this makes the caller's first call draw what the original's first call would."""
        if self._run is None or self._run is self.original:
            return
        self._run = None
        gc.collect()  # the function's graph has reference cycles; its folded constants live in the arena
        self._run = graph_def_runner(self.function, self.graph_def)

    def without_collectives(self) -> Optional["OptimizedStep"]:
        """This step with its collectives made local (`seqmem.edge.collectives.local_graph_def`), for one
        worker to measure the plan alone: no collectives to abort when it runs out of memory, no re-plan.
        None where the graph runs a collective that cannot be made local, or came from a graph."""
        local = None if self.function is None else local_graph_def(self.graph_def)
        return None if local is None else OptimizedStep(self.analysis, self.plan, local, self.backend, self.function)

    def _adopt(self, plan: Plan) -> None:
        """Run `plan` from now on: drop this step's function and its device memory, then build the new one."""
        self._run = None
        gc.collect()  # the function's graph has reference cycles; its folded constants live in the arena
        step = build_step(self.analysis, plan, self.backend, self.function, self.original)
        self.plan, self.graph_def, self._run = step.plan, step.graph_def, step._run


def _ran_no_variable_update(graph_def: graph_pb2.GraphDef, failed: list[str]) -> bool:
    """Whether a call of `graph_def` that failed in the `failed` nodes (`_failed_nodes`) ran no op that changes
    a variable: each such op (`library.variable_writers`) depends, by data or control edges (a pinned
    order's among them), on the first failed node in the graph (`_failed_in_graph`), and TensorFlow runs
    nothing that depends on a failed node."""
    failed_here = _failed_in_graph(graph_def, failed)
    if failed_here is None:
        return False
    readers = defaultdict(list)
    for node in graph_def.node:
        for name in node.input:
            readers[name.lstrip("^").split(":")[0]].append(node.name)
    after, stack = set(), [failed_here]
    while stack:
        for reader in readers[stack.pop()]:
            if reader not in after:
                after.add(reader)
                stack.append(reader)
    return variable_writers(graph_def) <= after


def _failed_in_graph(graph_def: graph_pb2.GraphDef, failed: list[str]) -> Optional[str]:
    """The first of the `failed` nodes that is a node of the graph; else, for the first failed node inside
    a function, the loop running it: where exactly one node of the graph runs that function
    (`library.nodes_running`) and it is a `While`, whose outputs exist only once every iteration ran (an
    OOM inside a lowered loop's body names the body's node alone). None otherwise: a call, which
    TensorFlow inlines, may have passed some outputs on before its failed node ran."""
    names = {node.name: node.op for node in graph_def.node}
    in_graph = next((name for name in failed if name in names), None)
    if in_graph is not None or not failed:
        return in_graph
    running = nodes_running(graph_def, failed[0])
    if len(running) != 1:
        return None
    (loop,) = running
    return loop if names[loop] in FUNCTIONAL_LOOP_OPS else None


def _failed_nodes(message: str) -> list[str]:
    """The nodes a TensorFlow error message names (the failed one first, then the calls it ran in), as named
    in the step's graph."""
    return [name.removeprefix(f"{IMPORT_SCOPE}/") for name in _FAILED_NODE.findall(message)]


def build_step(analysis: StepAnalysis, plan: Plan, backend: SwapBackend,
               function: Optional[capture.ConcreteFunction] = None, original: Any = None) -> OptimizedStep:
    """The step that runs the analysed graph rewritten by `plan`: callable like `original` (the user's
    tf.function or `function`) when `function` is given, a GraphDef to run in a Session otherwise; its
    GraphDef made by `step_passes.rewritten_graph_def`."""
    graph_def = rewritten_graph_def(analysis, plan, backend).graph_def
    return OptimizedStep(analysis, plan, graph_def, backend, function, original)
