"""Error types raised by seqmem, each with a message that says what to do."""

__all__ = [
    "GraphError",
    "NoBackwardPassError",
    "SeqmemError",
    "TensorFlowAlreadyInitializedError",
    "UnknownShapeError",
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
