"""The largest batch that trains under a budget, found by real out-of-memory errors.

Each probe runs in a fresh emulated-device process (`seqmem.runtime.device.run_with_budget`):
doubling from batch 1 until a probe fails, then bisecting. A batch fits when it
trains in each of `runs` fresh processes (a peak depends on the process's
history, so one success is not a promise). A probe that crashes, hangs or
raises something other than an OOM counts as "does not fit" and is reported in
`BatchSearch.notes`, never fatal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from seqmem.runtime.device import run_with_budget

__all__ = ["PROBE_STALL_S", "BatchSearch", "extrapolated_batch", "largest_batch"]

PROBE_STALL_S = 2.0  # a probe's steps run on inputs in memory: idle this long, it waits on a full arena (an OOM)


@dataclass
class BatchSearch:
    """Result of `largest_batch`: the batch (0 if even batch 1 fails), what the last
    probe of each batch that fit returned, by batch, and a line per probe that failed other
    than by OOM (or that failed after an earlier run of the same batch trained)."""

    batch: int
    values: dict[int, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def largest_batch(
    probe: Callable[..., Any],
    *args: Any,
    budget_mb: int,
    limit: int,
    start: int = 1,
    precision: float = 0.0,
    runs: int = 1,
    one_stream: bool = True,
    timeout_s: float = 600.0,
    on_probe: Callable[[int, str], None] | None = None,
    known: Mapping[int, bool] | None = None,
) -> BatchSearch:
    """Largest batch <= `limit` for which `probe(batch, *args)` succeeds under `budget_mb` MiB.

    The probe is a module-level function run in a fresh process; it succeeds when it
    returns a truthy value without error, and is stopped as out of memory once it sits
    idle for 2 s (`run_with_budget`'s `stall_s`: probes must not wait on input
    pipelines). `start` is the first batch tried (a good guess saves probes); the bisection stops once the bracket is within `precision`
    (relative: 0.02 means the answer is within 2% of the true largest batch);
    `runs`: fresh processes a batch must train in, stopping at the first that fails;
    `one_stream`: the emulated device's executor setting (`run_with_budget`);
    `on_probe(batch, verdict)` is called after each probe; `known`: batches already tried the same way,
    whether each trained in `runs` fresh processes, taken as they are instead of probed again.
    """
    if limit < 1 or not 1 <= start <= limit:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    if not 0 <= precision < 1:
        raise ValueError(f"precision must be in [0, 1), got {precision}")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    search = BatchSearch(batch=0)

    def trains_once(batch: int, run_index: int) -> bool:
        run = run_with_budget(probe, batch, *args, budget_mb=budget_mb, timeout_s=timeout_s, one_stream=one_stream,
                              stall_s=PROBE_STALL_S)
        verdict = run.verdict if not run.ok or run.value else "failed"
        if on_probe is not None:
            on_probe(batch, verdict)
        if run.ok:
            search.values[batch] = run.value
        failed_after_training = run_index > 0 and verdict != "ok"
        if (not run.ok and run.verdict != "oom") or failed_after_training:
            lines = run.message.strip().splitlines() or [""]
            said = lines[0] if run.verdict == "crashed" else lines[-1]  # a crash: its exit status, not its stderr
            which = f"batch {batch}" + (f", run {run_index + 1} of {runs}" if runs > 1 else "")
            search.notes.append(f"{which}: {verdict}: {said}")
        return verdict == "ok"

    def fits(batch: int) -> bool:
        if known and batch in known:
            return known[batch]
        if all(trains_once(batch, i) for i in range(runs)):
            return True
        search.values.pop(batch, None)
        return False

    low, high = 0, start  # low trains (0: none known), high is the next batch to try
    while high <= limit and fits(high):
        low, high = high, 2 * high
    high = min(high, limit + 1)
    while high - low > max(1, int(precision * low)):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    search.batch = low
    return search


def extrapolated_batch(peak_at_one: int, peak_at_two: int, budget_bytes: int) -> int:
    """The largest batch (at least 1) at which a peak affine in the batch, `peak_at_one` bytes at batch 1
    and `peak_at_two` at batch 2, stays within `budget_bytes`: where a search for B_base can start."""
    growth = max(peak_at_two - peak_at_one, 1)
    return max(1, 1 + (budget_bytes - peak_at_one) // growth)
