"""Pausing Python's cyclic garbage collector around allocation-heavy analysis.

The planner creates millions of short-lived objects (buffers, tensor
references) while a large graph is alive; each collection of the oldest
generation walks every tracked object of that graph. Measured on ResNet-1001
(62k nodes): a BFC simulation takes 1.2 s with the collector paused, 1.9-2.6 s
with it running. Nothing the planner builds forms reference cycles, so
reference counting alone frees it.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["gc_paused", "without_gc"]

_F = TypeVar("_F", bound=Callable)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(function: _F) -> _F:
    """Decorator: run `function` inside `gc_paused()`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with gc_paused():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
