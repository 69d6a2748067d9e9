"""Trigger choice: when to start bringing a swapped tensor back.

The swap-in of a tensor waits, through a control edge, for a trigger node. The
trigger is the backward node with the latest estimated completion time such
that completion + transfer time <= the start of the first consumer, so the copy
overlaps computation yet arrives as late as possible. A trigger must not depend
on the consumer (that would be a cycle): only nodes earlier than the consumer in
the order the step runs in qualify, which guarantees it. For a step pinned to an
order that order is the one: a trigger earlier in some other topological order
but later in the pinned one would make the pinned chain and the swap-in wait for
each other.

No product Grappler regroups is a trigger (`ir.regrouped`).

A restore asked to come as late as possible takes the last backward node before its first
consumer in that order (`last_before`). Estimated completion times come from an ASAP
schedule, and on a pinned step two backward nodes that could start together run one after
the other, so "completes before the consumer starts" can be many nodes early there.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from seqmem.analyze.critical_path import Timing
from seqmem.ir.graph import Graph
from seqmem.ir.regrouped import regrouped_pairs

__all__ = ["TriggerIndex"]


@dataclass(frozen=True)
class _Candidate:
    completion_s: float
    position: int
    name: str


class TriggerIndex:
    """Backward nodes sorted by estimated completion time, for repeated trigger queries."""

    def __init__(self, graph: Graph, timing: Timing, backward: Iterable[str],
                 position: Mapping[str, int] | None = None) -> None:
        """position: each node's place in the order the step runs in (a schedule or a pinned order, every
        node of `graph`); the graph's topological order when None."""
        regrouped = regrouped_pairs(graph)  # a trigger drives a control edge, which would keep Grappler from them
        backward = [name for name in backward if name not in regrouped]  # read twice below
        self._position = position if position is not None else {
            name: i for i, name in enumerate(graph.topological_order())}
        self._timing = timing
        candidates = sorted(
            (_Candidate(timing.completion_s[n], self._position[n], n) for n in backward),
            key=lambda c: (c.completion_s, c.position),
        )
        self._candidates = candidates
        self._completions = [c.completion_s for c in candidates]
        self._by_position = sorted((self._position[n], n) for n in backward)

    def choose(self, consumers: Iterable[str], transfer_s: float) -> tuple[str | None, bool]:
        """The trigger for a swap-in read by `consumers`, and whether the transfer is fully hidden.

        Returns (None, False) when no backward node precedes the consumers.
        """
        consumers = list(consumers)
        first = min(consumers, key=lambda n: (self._timing.start_s[n], self._position[n]))
        limit = min(self._position[n] for n in consumers)
        start = self._timing.start_s[first]
        for deadline, hidden in ((start - transfer_s, True), (start, False)):
            done_by_deadline = bisect.bisect_right(self._completions, deadline)
            for index in range(done_by_deadline - 1, -1, -1):
                candidate = self._candidates[index]
                if candidate.position < limit:
                    return candidate.name, hidden
        return None, False

    def last_before(self, consumers: Iterable[str]) -> str | None:
        """The backward node that runs last before the first of `consumers` in the order, or None."""
        limit = min(self._position[n] for n in consumers)
        index = bisect.bisect_left(self._by_position, (limit, ""))
        return self._by_position[index - 1][1] if index else None
