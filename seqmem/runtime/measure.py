"""Helpers for running a step to measure it, leaving no trace: inputs from specs,
waiting for results, and restoring the variables the step changed."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_array_ops, gen_resource_variable_ops, resource_variable_ops

__all__ = ["block", "captured_variables", "inputs_like", "spec_of", "step_peaks", "timed_steps", "variables_restored"]


def captured_variables(function: Any) -> list[tf.Tensor]:
    """The handles of every resource variable the ConcreteFunction `function` captures: all a call can
    change. (`function.graph.variables` lists only the variables its trace watched; it misses, e.g., the
    slots and step counter Keras' legacy optimizers create while the step is traced.)"""
    return [external for external, _ in function.graph.captures
            if external.dtype == tf.resource and _value_dtype(external) is not None]


def _value_dtype(handle: tf.Tensor) -> tf.DType | None:
    """The dtype of the variable behind a resource handle; None for a handle that is not a variable's."""
    data = resource_variable_ops.get_eager_safe_handle_data(handle)
    if data is None or not data.is_set or len(data.shape_and_type) != 1:
        return None
    return tf.as_dtype(data.shape_and_type[0].dtype)


class variables_restored:
    """Context manager: snapshot `variables` (tf.Variables or their resource handles) to host memory,
    restore them on exit (also on error)."""

    def __init__(self, variables) -> None:
        self._handles = [v.handle if isinstance(v, tf.Variable) else v for v in variables]
        self._saved: list[np.ndarray] = []

    def __enter__(self) -> None:
        self._saved = [np.array(gen_resource_variable_ops.read_variable_op(h, _value_dtype(h)).numpy(), copy=True)
                       for h in self._handles]

    def __exit__(self, *exc: Any) -> None:
        for handle, value in zip(self._handles, self._saved):
            _assign_in_place(handle, value)
        self._saved = []


_UPDATED_IN_PLACE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


def _assign_in_place(handle: tf.Tensor, value: np.ndarray) -> None:
    """Set the variable behind `handle` to `value`, in the buffer it already has where that is exact.

    `AssignVariableOp` adopts its value's buffer, which moves the variable to wherever that value was
    allocated: restored so after every calibration or measurement, a model's weights and slots would move
    through its arena, and the arena's history with them. Two in-place writes instead:

    - a variable in TensorFlow's copy-on-read mode (one a sparse op touched, `seqmem.edge.copy_on_read`)
      gets `var[:] = value` (`ResourceStridedSliceAssign`): any other update would
      copy it to a new buffer first;
    - any other variable gets `AssignSub` of a copy of itself, then `AssignAdd` of the value, which update
      the buffer in place without changing the variable's mode: v - copy(v) is exactly 0 where v is finite,
      and 0 + value exactly value but for -0.0.

    Elsewhere (another dtype, a scalar in copy-on-read mode, a non-finite current value, a -0.0 to restore)
    a copy of the value is assigned."""
    dtype = _value_dtype(handle)
    current = gen_resource_variable_ops.read_variable_op(handle, dtype)
    copies_on_read = _copies_on_read(handle, current)
    if dtype in _UPDATED_IN_PLACE and value.ndim and copies_on_read:
        del current
        gen_array_ops.resource_strided_slice_assign(handle, [0], [0], [1], tf.constant(value), begin_mask=1,
                                                    end_mask=1)
        return
    exact = dtype in _UPDATED_IN_PLACE and not copies_on_read and not (dtype.is_floating and (
        np.signbit(value[value == 0]).any() or not bool(tf.reduce_all(tf.math.is_finite(current)))))
    if not exact:
        del current
        # a copy of its own: a variable that adopted `tf.constant(value)`'s buffer was moved to a new buffer by
        # its next `assign_sub` in 24 of 30 trials (one-off script); adopting a `DeepCopy`, in none of 30
        gen_resource_variable_ops.assign_variable_op(handle, gen_array_ops.deep_copy(tf.constant(value)))
        return
    copy = current + tf.zeros([], dtype)  # a buffer of its own
    del current  # the variable's buffer is referenced once again: updated in place
    gen_resource_variable_ops.assign_sub_variable_op(handle, copy)
    del copy
    gen_resource_variable_ops.assign_add_variable_op(handle, tf.constant(value))


def _copies_on_read(handle: tf.Tensor, read: tf.Tensor) -> bool:
    """Whether the variable behind `handle` is in copy-on-read mode: a second read, while `read` is held,
    gets a buffer of its own. (Only a variable on the CPU can be told; others count as not.)"""
    if "CPU" not in read.device:
        return False
    again = gen_resource_variable_ops.read_variable_op(handle, read.dtype)
    return _address(read) != _address(again)


def _address(tensor: tf.Tensor) -> int:
    return np.asarray(tensor).__array_interface__["data"][0]


def block(result: Any) -> None:
    """Wait until every tensor in `result` is computed."""
    for tensor in tf.nest.flatten(result):
        if hasattr(tensor, "numpy"):
            tensor.numpy()


def inputs_like(structure: Any) -> Any:
    """Tensors for a (nested) structure of TensorSpecs, tensors or arrays: tensors pass through; NumPy
    arrays are copied to the device (`device.on_device`); floating specs get seeded normal values, others
    ones (valid labels, token ids and sequence lengths: a length of 0 would fail the checks of e.g. tfa's
    attention)."""
    from seqmem.runtime import device

    def make(value):
        if isinstance(value, (np.ndarray, np.generic)):
            return device.on_device(value)
        if not isinstance(value, tf.TensorSpec):
            return tf.convert_to_tensor(value)
        if value.dtype.is_floating:
            return tf.random.stateless_normal(value.shape, seed=[0, 0], dtype=value.dtype)
        return tf.ones(value.shape, value.dtype)

    return tf.nest.map_structure(make, structure)


def spec_of(value: Any) -> tf.TensorSpec:
    """The TensorSpec of a step's argument: a TensorSpec, a tensor or a NumPy array (or scalar). Raises
    TypeError for anything else."""
    if isinstance(value, tf.TensorSpec):
        return value
    if isinstance(value, tf.Tensor):
        return tf.TensorSpec.from_tensor(value)
    if isinstance(value, (np.ndarray, np.generic)):  # what `inputs_like` copies to the device
        return tf.TensorSpec(value.shape, tf.as_dtype(value.dtype))
    raise TypeError(f"step inputs must be tensors, NumPy arrays or tf.TensorSpecs, got {type(value).__name__}")


def step_peaks(run: Any, args: Any, variables, calls: int, warm_up: bool = False) -> list[int]:
    """Peak device bytes of each of `calls` calls of `run(*args)` (after one unmeasured call if
    `warm_up`), with `variables` restored afterwards, also on error (ResourceExhaustedError included)."""
    from seqmem.runtime import device

    peaks = []
    with variables_restored(variables):
        if warm_up:
            block(run(*args))
        for _ in range(calls):
            device.reset_peak()
            block(run(*args))
            peaks.append(device.memory_stats().peak_bytes)
    return peaks


def timed_steps(run: Any, args: Any, calls: int) -> tuple[list[int], list[float]]:
    """Peak device bytes and wall-clock seconds of each of `calls` calls of `run(*args)`, after one
    unmeasured warm-up call. Variables change as the step trains; nothing is restored."""
    import time

    from seqmem.runtime import device

    block(run(*args))
    peaks, seconds = [], []
    for _ in range(calls):
        device.reset_peak()
        started = time.perf_counter()
        block(run(*args))
        seconds.append(time.perf_counter() - started)
        peaks.append(device.memory_stats().peak_bytes)
    return peaks, seconds
