"""One iteration of a loop's body, replayed through an allocator model as the loop runs.

The simulator treats a while loop as one node. What its body allocates while it runs, and where the
allocator places it, decides the loop's peak: the BFC allocator hands a request a free chunk of up to twice
its size, so a loop's chunks depend on the order its body allocates and frees in, iteration after
iteration, and on where each iteration's element of a list the loop fills lands among them. An `Iteration`
is that order, taken from the body simulated once (`seqmem.edge.bodies`); `replay` runs it once per
iteration through the simulator's allocator model, placing each list's element as the iteration writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

__all__ = ["Iteration", "Replayed", "replay"]


@dataclass(frozen=True)
class Iteration:
    """One iteration of a loop's body in the order it runs, `steps` nodes long.

    buffers: (bytes, first step, last step) of each buffer the body allocates, allocated as its first step
    runs and freed once its last has run (last step -1: at the iteration's end). elements: (loop output,
    step) of each element the iteration writes to a list, by the loop's output that list becomes, placed
    as that step runs. peak_bytes: the most bytes its buffers hold at once, what the loop is charged.
    """

    steps: int
    buffers: tuple[tuple[int, int, int], ...]
    elements: tuple[tuple[int, int], ...] = ()

    @cached_property
    def peak_bytes(self) -> int:
        live = peak = 0
        for allocated, freed, _ in self._by_step:
            live += sum(self.buffers[i][0] for i in allocated)
            peak = max(peak, live)
            live -= sum(self.buffers[i][0] for i in freed)
        return peak

    @cached_property
    def _by_step(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]:
        """Per step: the buffers allocated, the buffers freed after it, the loop outputs written."""
        allocated: list[list[int]] = [[] for _ in range(self.steps + 1)]
        freed: list[list[int]] = [[] for _ in range(self.steps + 1)]
        written: list[list[int]] = [[] for _ in range(self.steps + 1)]
        for index, (_, first, last) in enumerate(self.buffers):
            allocated[first].append(index)
            freed[self.steps if last < 0 else last].append(index)
        for output, step in self.elements:
            written[step].append(output)
        return tuple((tuple(a), tuple(f), tuple(w)) for a, f, w in zip(allocated, freed, written))


@dataclass(frozen=True)
class Replayed:
    """What `replay` did: the handle of each filled list's elements by loop output, and the most chunk and
    tensor bytes in use in the allocator while the loop ran."""

    list_handles: Mapping[int, int]
    peak_in_use_bytes: int
    peak_tensor_bytes: int


def replay(model, iteration: Iteration, lists: Mapping[int, tuple[int, int]], held: Sequence[int],
           tensor_bytes: int) -> Replayed:
    """Run a loop in `model` (an allocator model of `seqmem.sim.allocator`, `tensor_bytes` of tensors in
    use in it): as many iterations as its longest filled list has elements (one when it fills none), each
    holding a buffer of each of `held`'s sizes (its scratch beyond the body's buffers) and running
    `iteration`, which places, as it writes it, the element of each list of `lists` ({loop output: (bytes,
    elements)}); an element the iteration does not write is placed at its end. The body's buffers are
    freed as the iteration frees them; the lists' elements stay."""
    elements: dict[int, list[int]] = {output: [] for output in lists}
    written = {output for output, _ in iteration.elements}
    peak, tensor_peak = model.in_use_bytes, tensor_bytes
    sizes = [size for size, _, _ in iteration.buffers]

    def place(output: int, round_: int) -> int:
        size, count = lists[output]
        if round_ >= count:
            return 0
        elements[output].append(model.allocate(size // count))
        return size // count

    for round_ in range(max((count for _, count in lists.values()), default=1)):
        extra = [model.allocate(size) for size in held]
        live = tensor_bytes + sum(held)
        handles: dict[int, int] = {}
        for allocated, freed, outputs in iteration._by_step:
            for index in allocated:
                handles[index] = model.allocate(sizes[index])
                live += sizes[index]
            for output in outputs:
                if output in lists:
                    placed = place(output, round_)
                    live += placed
                    tensor_bytes += placed
            peak, tensor_peak = max(peak, model.in_use_bytes), max(tensor_peak, live)
            for index in freed:
                model.free(handles.pop(index))
                live -= sizes[index]
        for output in lists:
            if output not in written:
                tensor_bytes += place(output, round_)
        peak, tensor_peak = max(peak, model.in_use_bytes), max(tensor_peak, tensor_bytes + sum(held))
        for handle in extra:
            model.free(handle)
    return Replayed({output: model.group(handles) for output, handles in elements.items()}, peak, tensor_peak)
