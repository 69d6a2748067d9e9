"""Several workers of one `tf.distribute` step: every worker runs the same plan.

A step whose graph issues collectives (`MultiWorkerMirroredStrategy`'s
all-reduce of the gradients) runs on every worker at once, and two workers'
collectives pair up by the order they are issued in: every worker must run the
same rewritten graph. seqmem plans deterministically from the same graph and
the same measurements: each worker analyzes and plans its own trace of the
step, from the highest of every worker's measurements of its own device (the
bytes in use before the step and each kernel's scratch: `Workers.agreed`),
calibration takes the highest peak any worker measured
(`Workers.highest`), and before a plan runs every worker checks that all of
them made the same one (`Workers.check_same`; `WorkersDisagreeError` on every
worker otherwise). A worker whose step fails (out of memory) aborts the
collectives (`Workers.abort`), so that the others' pending collectives fail
with its message instead of waiting for it; TensorFlow's collectives then stay
aborted until every worker restarts. So calibration first runs each plan with
its collectives made local (`seqmem.edge.collectives.local_graph_def`): a
worker that runs out of memory there fails alone, and every worker plans again
for less; only a plan that fitted on every worker runs with its collectives.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Sequence
from typing import Any, Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.eager import context

from seqmem.analyze.analysis import StepAnalysis
from seqmem.edge.collectives import collective_ops
from seqmem.errors import WorkersDisagreeError
from seqmem.decisions.plan import Plan

__all__ = ["ABORT_MARK", "Workers", "failure_line", "plan_digest", "workers_of"]

ABORT_MARK = "seqmem: a worker's step failed"  # begins the message a worker aborts the collectives with

@dataclasses.dataclass(frozen=True)
class Workers:
    """The workers of the `tf.distribute` strategy a step's collectives run under.

    strategy: the strategy in scope when `optimize` ran; count: its replicas in
    sync (one per worker under `MultiWorkerMirroredStrategy` on one device each).
    """

    strategy: Any
    count: int

    def gathered(self, values: Sequence[int]) -> list[list[int]]:
        """Every worker's `values` (int64s, the same length on every worker), by replica."""
        return self._gather(tf.constant([list(values)], tf.int64)).numpy().tolist()

    @functools.cached_property
    def _gather(self) -> Any:
        """One traced all-gather of a [1, n] int64 row from every replica (a strategy's collectives run
        eagerly one op at a time, with a warning each)."""
        strategy = self.strategy

        @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int64)], autograph=False)
        def gather(local):
            return strategy.gather(strategy.run(tf.identity, args=(local,)), axis=0)

        return gather

    def highest(self, values: Sequence[Optional[int]]) -> list[Optional[int]]:
        """Per position, the highest of every worker's `values`; None where any worker's is None."""
        rows = self.gathered([-1 if value is None else value for value in values])
        return [None if min(column) < 0 else max(column) for column in zip(*rows)]

    def agreed(self, analysis: StepAnalysis) -> StepAnalysis:
        """`analysis` with what each worker measured of its own device replaced by the highest of any worker's:
        the bytes in use before the step, and each node's scratch bytes (every worker probes its own kernels,
        and BFC can hand a probe's temporaries larger chunks on one than on another). Raises
        WorkersDisagreeError, on every worker, when the workers traced graphs with different nodes."""
        nodes = sorted(analysis.graph.nodes)
        if len({row[0] for row in self.gathered([_digest(nodes)])}) > 1:
            raise WorkersDisagreeError(
                f"the {self.count} workers of this tf.distribute step traced different graphs (their nodes "
                f"differ), so they cannot run one plan. Every worker must optimize the same step, traced for "
                f"the same input shapes.")
        devices = sorted(analysis.in_use_before_bytes)
        highest = self.highest([analysis.in_use_before_bytes[name] for name in devices]
                               + [analysis.scratch_bytes.get(name, 0) for name in nodes])
        in_use, scratch = highest[:len(devices)], highest[len(devices):]
        return dataclasses.replace(analysis, in_use_before_bytes=dict(zip(devices, in_use)),
                                   scratch_bytes={name: size for name, size in zip(nodes, scratch) if size})

    def check_same(self, plan: Plan) -> None:
        """Raise WorkersDisagreeError, on every worker, unless every worker is about to run `plan`; it names
        the parts of the plans that differ."""
        parts = _part_digests(plan)
        rows = self.gathered(list(parts.values()))
        differ = [part for part, column in zip(parts, zip(*rows)) if len(set(column)) > 1]
        if differ:
            raise WorkersDisagreeError(
                f"the {self.count} workers of this tf.distribute step planned differently (their plans differ "
                f"in: {', '.join(differ)}), so their collectives would not pair up. Every worker must optimize "
                f"the same step, traced for the same input shapes, with the same options and budget, on a "
                f"device holding the same memory; pass the same sample_inputs where a loop's trip count "
                f"depends on the data.")

    def abort(self, message: str) -> None:
        """Fail every collective pending here or issued later, so that the other workers' pending ones fail
        with `message` instead of waiting for this worker. They stay failed until the process restarts."""
        context.context().abort_collective_ops(tf.errors.UNAVAILABLE, f"{ABORT_MARK}: {message}")


def failure_line(message: str) -> str:
    """The line of a TensorFlow error `message` that says what failed: a worker's abort or the out-of-memory
    line when there is one (with the node that ran out, where the message names it: `[[{{node name}}]]`),
    else the first line that is not a generic header."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    oom = [line for line in lines if ABORT_MARK in line or "OOM when allocating" in line]
    informative = [line for line in lines if not line.endswith("execution error:")]
    line = (oom or informative or lines or [""])[0]
    node = re.search(r"\{\{node ([^}]+)\}\}", message)
    if "OOM when allocating" in line and node is not None:
        line += f" in node {node[1]}"
    return line


def plan_digest(plan: Plan) -> int:
    """A 62-bit digest of what the rewritten step runs: decisions, loop swaps, pinned order, split gradient
    joins and loop bound (not the predictions, which hold each worker's own measurements)."""
    return _digest(tuple(_part_digests(plan).values()))


def _part_digests(plan: Plan) -> dict[str, int]:
    """`plan_digest`'s parts, each digested alone, by what a message calls them."""
    parts = {
        "decisions": [(str(d.tensor), repr(d.kind), d.trigger, d.consumers) for d in plan.decisions],
        "loop swaps": [repr(swap) for swap in plan.loop_swaps],
        "pinned order": plan.pinned_order,
        "split gradient joins": plan.split_barriers,
        "loop bound": plan.loop_parallel_iterations,
    }
    return {name: _digest(value) for name, value in parts.items()}


def _digest(value: Any) -> int:
    """A 62-bit digest of `value`'s repr (an int64 a collective carries)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "big") >> 2


def workers_of(graph_def: graph_pb2.GraphDef) -> Optional[Workers]:
    """The workers a step of `graph_def` runs on: None when it issues no collective; else those of the
    `tf.distribute` strategy in scope. Raises ValueError for collectives with no strategy in scope."""
    collectives = collective_ops(graph_def)
    if not collectives:
        return None
    if not tf.distribute.has_strategy():
        raise ValueError(
            f"the step issues collectives ({collectives[0]} and {len(collectives) - 1} more): it runs under a "
            f"tf.distribute strategy, and every worker must run the same plan. Call seqmem.optimize inside "
            f"`with strategy.scope():` on every worker, so that the workers can agree on it.")
    strategy = tf.distribute.get_strategy()
    return Workers(strategy, strategy.num_replicas_in_sync)
