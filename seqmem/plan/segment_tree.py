"""A max segment tree: range add, global max and where it is, O(log n) each.

The selector tracks the predicted live bytes at every schedule position in one
(`seqmem.plan.search`): conserving a tensor is a range update.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MaxTree"]


class MaxTree:
    """Range add, global max (and where) over a fixed-length integer array."""

    def __init__(self, values: Sequence[int]) -> None:
        size = 1
        while size < max(1, len(values)):
            size *= 2
        self._size = size
        self._max = [float("-inf")] * (2 * size)
        self._add = [0] * (2 * size)
        for i, value in enumerate(values):
            self._max[size + i] = value
        for i in range(size - 1, 0, -1):
            self._max[i] = max(self._max[2 * i], self._max[2 * i + 1])

    def add(self, low: int, high: int, delta: int, node: int = 1, left: int = 0, right: int | None = None) -> None:
        """Add `delta` to positions low..high-1."""
        right = self._size if right is None else right
        if high <= left or right <= low:
            return
        if low <= left and right <= high:
            self._max[node] += delta
            self._add[node] += delta
            return
        middle = (left + right) // 2
        self.add(low, high, delta, 2 * node, left, middle)
        self.add(low, high, delta, 2 * node + 1, middle, right)
        self._max[node] = max(self._max[2 * node], self._max[2 * node + 1]) + self._add[node]

    def max(self) -> int:
        return self._max[1]

    def argmax(self) -> int:
        node = 1
        while node < self._size:
            rest = self._max[node] - self._add[node]
            node = 2 * node if self._max[2 * node] == rest else 2 * node + 1
        return node - self._size
