"""Memory-efficient LSTM and GRU layers: each step's gates are recomputed in backward instead of stored.

Autodiff through `tf.keras.layers.LSTM` keeps, for every time step, what the
gradient of each op needs: gates, states and the cell state's tanh (seven
[batch, units] tensors a step in Keras' step-by-step loop; the GRU six, as
`_saved_bytes_per_step` in tests/layers/test_recurrent.py counts them at 256
units). Here a step is one `tf.custom_gradient` function of (input, states)
whose backward runs the step again under a tape, so the loop
keeps only the step's input and incoming states (two tensors and the input for
the LSTM, one and the input for the GRU): the memory-efficient
recurrent layer of Meng et al.'s Table 2(a), after Gruslys et al. 2016
(memory-efficient backpropagation through time), at the cost of one more
forward step per step. The layers' forward loops run one iteration at a time
(Keras' run up to 32 at once), and each recomputation waits for the step's
incoming gradient (a control edge), so a gradient loop running ahead does not
recompute many steps at once.

`MemoryEfficientLSTM` and `MemoryEfficientGRU` subclass Keras' layers and change
only the differentiation: constructor, config, variables (names and shapes) and
outputs are Keras', so a checkpoint written with one loads into the other. The
GRU always runs the cell step by step in Keras' generic RNN loop (not its fused
`standard_gru`/cuDNN function), which seqmem's loop rewrites can see. The LSTM
does so where the inputs have a mask or are ragged, or with `go_backwards`,
`stateful` or `unroll`; otherwise it runs `seqmem.layers.lstm_sequence`, which keeps
the same (inputs, h and c of every step) and does the products that do not wait
on the recurrence for blocks of steps at once (throughput against Keras' LSTM:
`python -m models.lm.benchmark`, docs/results.md). Dropout and recurrent dropout are not supported
(their masks would have to be replayed in backward): a nonzero rate is a
ValueError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from seqmem.layers.lstm_sequence import lstm_sequence

__all__ = ["MemoryEfficientGRU", "MemoryEfficientGRUCell", "MemoryEfficientLSTM", "MemoryEfficientLSTMCell"]


def _recomputed(step: Callable[..., Sequence[tf.Tensor]], *inputs: tf.Tensor) -> list[tf.Tensor]:
    """`step(*inputs)`, differentiated by running `step` again in backward (its intermediates not kept).
    `step` must read no variable: pass their values among `inputs`."""

    @tf.custom_gradient
    def run(*args):
        outputs = list(step(*args))

        def grad(*output_gradients):
            with tf.control_dependencies(output_gradients):  # recompute when this step's gradient arrives
                again_inputs = [tf.identity(arg) for arg in args]
            with tf.GradientTape() as tape:
                tape.watch(again_inputs)
                again = step(*again_inputs)
            return tape.gradient(again, again_inputs, output_gradients=list(output_gradients),
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)

        return outputs, grad

    return run(*inputs)


_WEIGHTS = ("kernel", "recurrent_kernel", "bias")


def _weight_values(cell: tf.keras.layers.Layer) -> dict[str, tf.Tensor]:
    """The cell's weights read as tensors (in the loop body, where the step runs), by attribute name."""
    return {name: tf.convert_to_tensor(getattr(cell, name)) for name in _WEIGHTS if getattr(cell, name) is not None}


@contextlib.contextmanager
def _weights_as(cell: tf.keras.layers.Layer, values: dict[str, tf.Tensor]):
    """Within the block, the cell's step reads `values` instead of its variables (the attributes are set in
    the instance dict directly, past Keras' tracking, and restored on exit)."""
    saved = {name: cell.__dict__[name] for name in values}
    try:
        cell.__dict__.update(values)
        yield
    finally:
        cell.__dict__.update(saved)


def _check_no_dropout(cell: tf.keras.layers.Layer, layer: str) -> None:
    if cell.dropout or cell.recurrent_dropout:
        raise ValueError(
            f"{layer} does not support dropout (got dropout={cell.dropout}, recurrent_dropout="
            f"{cell.recurrent_dropout}): its backward pass recomputes each step and would need the same masks. "
            f"Apply tf.keras.layers.Dropout to the layer's inputs or outputs instead."
        )


class MemoryEfficientLSTMCell(tf.keras.layers.LSTMCell):
    """`tf.keras.layers.LSTMCell` whose step is recomputed in backward (see the module docstring)."""

    def __init__(self, units: int, **kwargs) -> None:
        super().__init__(units, **kwargs)
        _check_no_dropout(self, type(self).__name__)

    def call(self, inputs, states, training=None):
        lstm_step, weights = super().call, _weight_values(self)

        def step(x, h, c, *values):
            with _weights_as(self, dict(zip(weights, values))):
                return lstm_step(x, [h, c], training=training)[1]

        h, c = _recomputed(step, inputs, states[0], states[1], *weights.values())
        return h, [h, c]


class MemoryEfficientGRUCell(tf.keras.layers.GRUCell):
    """`tf.keras.layers.GRUCell` whose step is recomputed in backward (see the module docstring)."""

    def __init__(self, units: int, **kwargs) -> None:
        super().__init__(units, **kwargs)
        _check_no_dropout(self, type(self).__name__)

    def call(self, inputs, states, training=None):
        gru_step, weights = super().call, _weight_values(self)
        nested = tf.nest.is_nested(states)

        def step(x, h, *values):
            with _weights_as(self, dict(zip(weights, values))):
                return [gru_step(x, [h] if nested else h, training=training)[0]]

        (h,) = _recomputed(step, inputs, states[0] if nested else states, *weights.values())
        return h, ([h] if nested else h)


def _one_iteration_at_a_time(call: Callable[[], Any]) -> Any:
    """`call()`, with every while loop it builds in a graph bounded to one iteration at a time.

    Keras' loop runs up to 32 iterations at once (`parallel_iterations` has no Keras argument, so the
    attribute is set on the new While ops). A gradient loop built by `tf.GradientTape` keeps the value the
    tape recorded, 32; `seqmem.optimize` bounds it too (`seqmem.edge.loops`).
    """
    if tf.executing_eagerly():
        return call()
    graph = tf.compat.v1.get_default_graph()
    known = len(graph.get_operations())
    result = call()
    for op in graph.get_operations()[known:]:
        if op.type in ("While", "StatelessWhile"):
            op._set_attr("parallel_iterations", attr_value_pb2.AttrValue(i=1))
    return result


class _RecomputedLoop:
    """What both layers add to their Keras class: the memory-efficient cell (`cell_class`, same config as
    Keras' own), run step by step, forward loop one iteration at a time."""

    cell_class: type

    def __init__(self, units: int, **kwargs) -> None:
        super().__init__(units, **kwargs)
        _check_no_dropout(self.cell, type(self).__name__)
        config = self.cell.get_config()
        del self.cell  # untracked, so the layer's weights are the new cell's alone
        self.cell = self.cell_class.from_config(config)
        self._could_use_gpu_kernel = False  # Keras' generic loop calls the cell; the fused kernels would not

    def call(self, inputs, mask=None, training=None, initial_state=None):
        return _one_iteration_at_a_time(lambda: super(_RecomputedLoop, self).call(
            inputs, mask=mask, training=training, initial_state=initial_state))


class MemoryEfficientLSTM(_RecomputedLoop, tf.keras.layers.LSTM):
    """Drop-in for `tf.keras.layers.LSTM` (same arguments, weights and outputs) that recomputes each step's
    gates in backward instead of storing them. Raises ValueError for nonzero dropout rates.

    Dense inputs without a mask run `seqmem.layers.lstm_sequence` (input-side products in blocks of steps); a
    mask, ragged inputs, `go_backwards`, `stateful` or `unroll` run the memory-efficient cell step by step in
    Keras' loop."""

    cell_class = MemoryEfficientLSTMCell

    def call(self, inputs, mask=None, training=None, initial_state=None):
        if (mask is not None or isinstance(inputs, tf.RaggedTensor) or self.go_backwards or self.stateful
                or self.unroll):
            return super().call(inputs, mask=mask, training=training, initial_state=initial_state)
        inputs, initial_state, _ = self._process_inputs(inputs, initial_state, None)
        x = inputs if self.time_major else tf.transpose(inputs, [1, 0, 2])
        weights = _weight_values(self.cell)
        hs, c = lstm_sequence(x, initial_state[0], initial_state[1], weights["kernel"],
                              weights["recurrent_kernel"], weights.get("bias"), self.cell.activation,
                              self.cell.recurrent_activation)
        h = hs[-1]
        if self.return_sequences:
            output = hs if self.time_major else tf.transpose(hs, [1, 0, 2])
        else:
            output = h
        return [output, h, c] if self.return_state else output


class MemoryEfficientGRU(_RecomputedLoop, tf.keras.layers.GRU):
    """Drop-in for `tf.keras.layers.GRU` (same arguments, weights and outputs) that recomputes each step's
    gates in backward instead of storing them. Raises ValueError for nonzero dropout rates."""

    cell_class = MemoryEfficientGRUCell
