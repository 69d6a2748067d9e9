"""What a function call's body holds beyond the call's inputs and outputs, as the arguments it frees decide it.

The simulator treats a function call as one node holding its inputs and its
outputs while it runs, and charges its body's own bytes beyond those as the
node's scratch (`seqmem.edge.bodies`). A body frees some of its arguments
before it ends: inlined, TensorFlow frees an argument once the last of its
body's readers ran, and a gradient call's loop frees the saved activations it
pops. Those bytes are then free for the body's later tensors, so what the call
must be charged depends on how large those arguments are: a list the plan swaps
to the host (`seqmem.sim.loop_swaps`) frees almost nothing when the loop pops
it. A `CallCharge` keeps the body's peaks apart by which arguments each one
follows, and charges the call for the arguments' bytes as the graph has them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CallCharge"]


@dataclass(frozen=True)
class CallCharge:
    """A call's charge, as a function of the bytes of the arguments its body frees.

    peaks: for each stretch of the body between two frees of such arguments, (the most bytes of the body's
    own tensors live in it, the call's input indices freed before it), in the order the body runs.
    returned_bytes: the buffers the body returns (the call's outputs, which the simulator holds for the
    whole call).
    """

    peaks: tuple[tuple[int, tuple[int, ...]], ...]
    returned_bytes: int

    def bytes(self, input_bytes: Callable[[int], int]) -> int:
        """Bytes to charge the call beyond its inputs and outputs (at least 0), its input `i` holding
        `input_bytes(i)` bytes: the most any stretch holds less the inputs freed before it."""
        held = max((own - sum(input_bytes(i) for i in freed) for own, freed in self.peaks), default=0)
        return max(0, held - self.returned_bytes)
