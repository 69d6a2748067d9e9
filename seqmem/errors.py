"""Every error type seqmem raises on purpose, each with a message that says what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from seqmem.plan.floor import Floor

__all__ = [
    "ArenaFragmentationError",
    "GraphError",
    "InfeasibleBudgetError",
    "NoBackwardPassError",
    "SeqmemError",
    "SimulatedOutOfMemoryError",
    "TensorFlowAlreadyInitializedError",
    "UnknownShapeError",
    "WorkersDisagreeError",
]


class SeqmemError(Exception):
    """Base class of every error seqmem raises on purpose."""


class GraphError(SeqmemError, ValueError):
    """The graph is malformed: a cycle, a missing producer, a dangling control edge."""


class NoBackwardPassError(SeqmemError, ValueError):
    """The graph has no gradient computation, so it is not a training step."""


class UnknownShapeError(SeqmemError, ValueError):
    """A tensor's static shape is unknown where seqmem needs its size in bytes."""


class TensorFlowAlreadyInitializedError(SeqmemError, RuntimeError):
    """The emulated device was requested after TensorFlow had already started."""


class InfeasibleBudgetError(SeqmemError, ValueError):
    """No plan fits the step into the budget.

    smallest_peak_bytes: the lowest peak any plan reaches, predicted by the
    simulator; measured_peak_bytes: the lowest peak measured on the device,
    when calibration measured one (None otherwise); floor: what that lowest
    predicted peak is made of (`seqmem.plan.floor.Floor`; None where not known);
    unplaced: where the plans' bytes fit but the allocator model placed no
    plan's buffers in the arena and the device then ran out of memory, what the
    model said (None otherwise): the floor is then not what stood in the way.
    The planner itself returns values (`seqmem.plan.PlanResult`); this is raised
    at `optimize`'s boundary.
    """

    def __init__(self, message: str, smallest_peak_bytes: Optional[int] = None,
                 measured_peak_bytes: Optional[int] = None, floor: Optional["Floor"] = None,
                 unplaced: Optional[str] = None) -> None:
        super().__init__(message)
        self.smallest_peak_bytes = smallest_peak_bytes
        self.measured_peak_bytes = measured_peak_bytes
        self.floor = floor
        self.unplaced = unplaced


class ArenaFragmentationError(InfeasibleBudgetError):
    """The plan's bytes fit the budget, but the allocator model cannot place its
    buffers in the arena (fragmentation): a limit of the model, which a device
    measurement can overrule."""


class SimulatedOutOfMemoryError(SeqmemError):
    """The allocator model cannot place a request within its memory limit."""


class WorkersDisagreeError(SeqmemError, RuntimeError):
    """The workers of one `tf.distribute` step planned differently, so their collectives would not pair up
    (`seqmem.runtime.workers`)."""
