"""Notice a process that has gone idle while it should be computing: a step waiting on a full arena.

TensorFlow's BFC allocator does not fail an allocation that does not fit: it
waits for other ops to free memory, up to 10 s per allocation
(`AllocatorRetry`), on every inter-op thread that asks. On one compute stream
nothing else runs to free any, so a step that does not fit sits idle for 10 s
or more, once per waiting allocation, before its ResourceExhaustedError. A
training step, a trace or a plan keeps a core busy; a process whose CPU time
stops advancing is waiting. `StallWatch` calls back once the process has used
under 5% of a core for `idle_s` seconds; `expected_idle` marks waits that are
not stalls (a child process doing the work).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

__all__ = ["StallWatch", "expected_idle"]

_BUSY_FRACTION = 0.05  # of one core: below this over the window, the process is idle
_POLL_S = 0.25

_expected_idle = 0
_lock = threading.Lock()


@contextlib.contextmanager
def expected_idle() -> Iterator[None]:
    """Within this block the process may sit idle (waiting for a child process) without being stalled."""
    global _expected_idle
    with _lock:
        _expected_idle += 1
    try:
        yield
    finally:
        with _lock:
            _expected_idle -= 1


class StallWatch:
    """A daemon thread that calls `on_stall(idle_seconds)` once, from that thread, when this
    process has used under 5% of a core for `idle_s` seconds outside `expected_idle` blocks."""

    def __init__(self, on_stall: Callable[[float], None], idle_s: float = 2.0) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s must be positive, got {idle_s!r}")
        self._on_stall, self._idle_s = on_stall, idle_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="seqmem-stall-watch", daemon=True)

    def __enter__(self) -> "StallWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        samples: deque[tuple[float, float]] = deque()  # (wall, process CPU) seconds
        while not self._stopped.wait(_POLL_S):
            now, cpu = time.monotonic(), time.process_time()
            with _lock:
                waiting_on_purpose = _expected_idle > 0
            if waiting_on_purpose:
                samples.clear()
                continue
            samples.append((now, cpu))
            while now - samples[0][0] > self._idle_s:
                samples.popleft()
            span = now - samples[0][0]
            if span >= self._idle_s - _POLL_S and cpu - samples[0][1] < _BUSY_FRACTION * span:
                self._on_stall(span)
                return
