"""Models of the device allocator, replayed over the simulator's allocation events.

TensorFlow's BFC allocator counts whole chunks as in use, and it hands out a
free chunk unsplit when the chunk is less than twice the request: a 9 MiB
tensor can occupy a 16 MiB chunk. Measured peaks (`get_memory_info`) include
that internal fragmentation, so the simulator replays its events through a
model of the allocator to predict them:

- `ExactAllocator`: bytes in use = sum of tensor sizes (an ideal allocator).
- `BFCAllocatorModel`: best-fit with coalescing as in TensorFlow's
  `bfc_allocator.cc`: 256-byte granularity; the smallest free chunk that fits
  (lowest address among equals); split only when the chunk is at least twice
  the rounded request or the remainder is at least 128 MiB; adjacent free
  chunks of a region merge on free. The first region, 2 MiB, exists from the
  start: a process's first allocations are small ones, made before any model
  exists. Then either
  - growth mode (TensorFlow's CPU arena): when nothing fits, a new region is
    allocated, doubling in size, so a model's first large tensor opens the
    second region (were the first region opened by a model's tensor
    instead, every later region would shift). Or
  - a reserved arena (`reserved=True`, as `seqmem.runtime.device.reserve_arena`
    leaves the emulated device's, and as a GPU's arena is by default): the
    second region is all the rest of the arena (unbounded without a limit),
    at lower addresses, and nothing grows.

A request may be made of equal pieces (a TensorList's elements, each a buffer
of its own): the models place each piece and free them together. Pieces
placed at different times (a list a loop fills) become one request with
`group`.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from seqmem.errors import SimulatedOutOfMemoryError

__all__ = ["BFCAllocatorModel", "ExactAllocator"]

_GRANULE = 256
_MAX_INTERNAL_FRAGMENTATION = 128 << 20
_INITIAL_REGION = 2 << 20
_UNBOUNDED = 1 << 60


class ExactAllocator:
    """Bytes in use are the sum of live request sizes."""

    def __init__(self) -> None:
        self.in_use_bytes = 0
        self._sizes: dict[int, int] = {}
        self._ids = itertools.count()

    def allocate(self, size_bytes: int, pieces: int = 1) -> int:
        """Count `size_bytes` (in however many `pieces`); returns a handle for `free`."""
        handle = next(self._ids)
        self._sizes[handle] = size_bytes
        self.in_use_bytes += size_bytes
        return handle

    def free(self, handle: int) -> None:
        self.in_use_bytes -= self._sizes.pop(handle)

    def group(self, handles: Sequence[int]) -> int:
        """One handle for `handles`, freed together."""
        handle = next(self._ids)
        self._sizes[handle] = sum(self._sizes.pop(piece) for piece in handles)
        return handle


@dataclass
class _Chunk:
    address: int
    size: int
    region: int
    free: bool = True
    prev: int | None = None
    next: int | None = None


class BFCAllocatorModel:
    """A model of TensorFlow's BFC allocator, in growth mode or over a reserved arena (`reserved`).

    limit_bytes: the arena's size; None for unlimited. Raises SimulatedOutOfMemoryError when a
    request cannot be met within it.
    """

    def __init__(self, limit_bytes: int | None = None, reserved: bool = False) -> None:
        self.limit_bytes = limit_bytes
        self.in_use_bytes = 0
        self.region_bytes = 0
        self._next_region = _INITIAL_REGION
        self._chunks: dict[int, _Chunk] = {}
        self._free: list[tuple[int, int, int]] = []  # (size, address, chunk id), sorted
        self._pieces: dict[int, list[int]] = {}  # handle of a request in pieces -> its chunks' handles
        self._ids = itertools.count()
        self._regions = 0
        self._reserved = reserved
        first = _INITIAL_REGION if limit_bytes is None else min(_INITIAL_REGION, limit_bytes // _GRANULE * _GRANULE)
        self._add_region(first, address=2 * _UNBOUNDED if reserved else 0)  # reserved: above the rest
        self._next_region *= 2
        rest = _UNBOUNDED if limit_bytes is None else (limit_bytes - first) // _GRANULE * _GRANULE
        if reserved and rest:  # an arena of 2 MiB or less is its first region alone
            self._add_region(rest, address=0)

    def allocate(self, size_bytes: int, pieces: int = 1) -> int:
        """Allocate a chunk for `size_bytes`, or `pieces` chunks of `size_bytes // pieces` each, one after
        another; returns a handle for `free`."""
        if pieces > 1:
            handle = next(self._ids)
            self._pieces[handle] = [self.allocate(size_bytes // pieces) for _ in range(pieces)]
            return handle
        rounded = max(_GRANULE, -(-size_bytes // _GRANULE) * _GRANULE)
        position = bisect.bisect_left(self._free, (rounded, -1, -1))
        if position == len(self._free):
            self._extend(rounded)
            position = bisect.bisect_left(self._free, (rounded, -1, -1))
        _, _, handle = self._free.pop(position)
        chunk = self._chunks[handle]
        if chunk.size >= 2 * rounded or chunk.size - rounded >= _MAX_INTERNAL_FRAGMENTATION:
            self._split(handle, rounded)
        chunk.free = False
        self.in_use_bytes += chunk.size
        return handle

    def group(self, handles: Sequence[int]) -> int:
        """One handle for chunks allocated one by one (`handles`), freed together."""
        handle = next(self._ids)
        self._pieces[handle] = list(handles)
        return handle

    def free(self, handle: int) -> None:
        """Return a chunk (or a request's pieces); it merges with free neighbours of its region."""
        if handle in self._pieces:
            for piece in self._pieces.pop(handle):
                self.free(piece)
            return
        chunk = self._chunks[handle]
        chunk.free = True
        self.in_use_bytes -= chunk.size
        for neighbour in (chunk.next, chunk.prev):
            if neighbour is not None and self._chunks[neighbour].free:
                self._remove_free(neighbour)
                first, second = (handle, neighbour) if neighbour == chunk.next else (neighbour, handle)
                self._merge(first, second)
                handle = first
                chunk = self._chunks[handle]
        bisect.insort(self._free, (chunk.size, chunk.address, handle))

    def _extend(self, rounded: int) -> None:
        if self._reserved:
            raise SimulatedOutOfMemoryError(f"cannot allocate {rounded} bytes: no free chunk that large in the "
                                            f"reserved {self.limit_bytes}-byte arena ({self.in_use_bytes} bytes in use)")
        available = None if self.limit_bytes is None else (self.limit_bytes - self.region_bytes) // _GRANULE * _GRANULE
        if available is not None and rounded > available:
            raise SimulatedOutOfMemoryError(f"cannot allocate {rounded} bytes: {available} bytes left of {self.limit_bytes}")
        increased = False
        while rounded > self._next_region:
            self._next_region *= 2
            increased = True
        size = self._next_region if available is None else min(self._next_region, available)
        if not increased:
            self._next_region *= 2
        self._add_region(size, address=self.region_bytes + self._regions * _GRANULE)

    def _add_region(self, size: int, address: int) -> None:
        handle = next(self._ids)
        self._chunks[handle] = _Chunk(address=address, size=size, region=self._regions)
        self._regions += 1
        self.region_bytes += size
        bisect.insort(self._free, (size, address, handle))

    def _split(self, handle: int, rounded: int) -> None:
        chunk = self._chunks[handle]
        rest = next(self._ids)
        self._chunks[rest] = _Chunk(
            address=chunk.address + rounded, size=chunk.size - rounded, region=chunk.region, prev=handle, next=chunk.next
        )
        if chunk.next is not None:
            self._chunks[chunk.next].prev = rest
        chunk.next = rest
        chunk.size = rounded
        bisect.insort(self._free, (self._chunks[rest].size, self._chunks[rest].address, rest))

    def _merge(self, first: int, second: int) -> None:
        a, b = self._chunks[first], self._chunks[second]
        a.size += b.size
        a.next = b.next
        if b.next is not None:
            self._chunks[b.next].prev = first
        del self._chunks[second]

    def _remove_free(self, handle: int) -> None:
        chunk = self._chunks[handle]
        position = bisect.bisect_left(self._free, (chunk.size, chunk.address, handle))
        del self._free[position]
