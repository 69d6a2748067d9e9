"""An LSTM over a whole sequence whose backward pass recomputes the gates, its input-side products in blocks.

`lstm_sequence` runs Keras' LSTM step (z = x·W + h·U + b, gates i, f, c, o in that order along z) over
time-major inputs and keeps for backward only the inputs and each step's h and c, as
`seqmem.MemoryEfficientLSTM` promises; backward recomputes a step's gates from them (Gruslys et al. 2016).

The matrix products that do not wait on the recurrence run for a block of steps at once, up to
`BLOCK_ROWS` rows (steps x batch), or one step where the batch is as large: x·W in both passes, and in
backward dz·Wᵀ, xᵀ·dz, hᵀ·dz and the bias' sum. Only h·U, its recomputation and dz·Uᵀ run step by step.
A small batch's per-step product runs at a fraction of a block's rate (2 Intel Xeon cores, 650 units, batch
128, float32: 300-330 GFLOP/s for xᵀ·dz and dz·Wᵀ one step at a time, 430-480 for 8 steps at once), which
pays for most of the recomputation. A block's transients in backward are its x·W, its gate gradients and
their stacked copy, [steps, batch, 4 x units] each.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

__all__ = ["BLOCK_ROWS", "lstm_sequence"]

BLOCK_ROWS = 1536

Activation = Callable[[tf.Tensor], tf.Tensor]


def lstm_sequence(inputs: tf.Tensor, initial_h: tf.Tensor, initial_c: tf.Tensor, kernel: tf.Tensor,
                  recurrent_kernel: tf.Tensor, bias: tf.Tensor | None, activation: Activation,
                  recurrent_activation: Activation) -> tuple[tf.Tensor, tf.Tensor]:
    """(every step's h [time, batch, units], the last step's c [batch, units]) of an LSTM over time-major
    `inputs` [time, batch, features], with Keras' weight layout (`kernel` [features, 4 x units],
    `recurrent_kernel` [units, 4 x units], `bias` [4 x units] or None). Differentiable in every tensor
    argument; `activation` and `recurrent_activation` are elementwise and differentiable."""
    activations = (activation, recurrent_activation)
    arguments = [inputs, initial_h, initial_c, kernel, recurrent_kernel] + ([bias] if bias is not None else [])

    @tf.custom_gradient
    def run(x, h0, c0, w, u, *optional_bias):
        b = optional_bias[0] if optional_bias else None
        hs, cs = _forward(x, h0, c0, w, u, b, activations)

        def grad(d_hs, d_c):
            d_hs = tf.zeros_like(hs) if d_hs is None else d_hs
            d_c = tf.zeros_like(c0) if d_c is None else d_c
            dx, dh0, dc0, dw, du, db = _backward(x, h0, c0, w, u, b, activations, hs, cs, d_hs, d_c)
            return [dx, dh0, dc0, dw, du] + ([db] if b is not None else [])

        return (hs, cs[-1]), grad

    return run(*arguments)


def _cell(z: tf.Tensor, c_before: tf.Tensor, activations: tuple[Activation, Activation]):
    """Keras' `LSTMCell` after its products: (h, c) of one step from z and the previous c."""
    activation, recurrent_activation = activations
    zi, zf, zc, zo = tf.split(z, 4, axis=1)
    c = recurrent_activation(zf) * c_before + recurrent_activation(zi) * activation(zc)
    return recurrent_activation(zo) * activation(c), c


def _pre_activation(xw: tf.Tensor, h_before: tf.Tensor, u: tf.Tensor, b: tf.Tensor | None) -> tf.Tensor:
    """z of one step, summed in Keras' order: x·W, then h·U, then the bias."""
    z = xw + tf.matmul(h_before, u)
    return z if b is None else tf.nn.bias_add(z, b)


def _input_products(x_block: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """x·W of every step of a block [steps, batch, features], as one product: [steps, batch, 4 x units]."""
    shape = tf.shape(x_block)
    flat = tf.matmul(tf.reshape(x_block, [-1, shape[2]]), w)
    return tf.reshape(flat, [shape[0], shape[1], -1])


def _blocks(x: tf.Tensor) -> tuple:
    """(steps, steps per block, number of blocks) for time-major `x`: as many steps as fit in `BLOCK_ROWS`
    rows, one at least. With static steps and batch, the largest divisor of the steps that fits, so that the
    blocks are equal and every tensor has a static shape (which the simulator sizes); otherwise tensors of
    `tf.shape`, the last block shorter."""
    steps, batch = x.shape[0], x.shape[1]
    if steps is not None and batch is not None:
        length = max(d for d in range(1, steps + 1) if steps % d == 0 and (d == 1 or d * batch <= BLOCK_ROWS))
        return steps, length, steps // length
    steps, batch = tf.shape(x)[0], tf.shape(x)[1]
    length = tf.maximum(1, BLOCK_ROWS // tf.maximum(batch, 1))
    return steps, length, (steps + length - 1) // length


def _block(x: tf.Tensor, start: tf.Tensor, end: tf.Tensor, length) -> tf.Tensor:
    """x[start:end], its leading dimension set where the blocks are equal."""
    return _with_steps(x[start:end], length)


def _with_steps(value: tf.Tensor, steps) -> tf.Tensor:
    """`value`, its static leading dimension set to `steps` when that is a Python int."""
    if isinstance(steps, int):
        value.set_shape(tf.TensorShape([steps]).concatenate(value.shape[1:]))
    return value


def _forward(x, h0, c0, w, u, b, activations):
    steps, length, count = _blocks(x)
    hs = tf.TensorArray(x.dtype, size=steps, element_shape=h0.shape)
    cs = tf.TensorArray(x.dtype, size=steps, element_shape=c0.shape)

    def block(j, h, c, hs, cs):
        start = j * length
        end = tf.minimum(start + length, steps)
        xw = _input_products(_block(x, start, end, length), w)

        def step(t, h, c, hs, cs):
            h, c = _cell(_pre_activation(xw[t - start], h, u, b), c, activations)
            return t + 1, h, c, hs.write(t, h), cs.write(t, c)

        _, h, c, hs, cs = tf.while_loop(lambda t, *_: t < end, step, (start, h, c, hs, cs), parallel_iterations=1)
        return j + 1, h, c, hs, cs

    _, _, _, hs, cs = tf.while_loop(lambda j, *_: j < count, block, (tf.constant(0), h0, c0, hs, cs),
                                    parallel_iterations=1)
    return _with_steps(hs.stack(), steps), _with_steps(cs.stack(), steps)


def _before(states: tf.Tensor, initial: tf.Tensor, start: tf.Tensor, end: tf.Tensor) -> tf.Tensor:
    """The states going into steps start..end-1: step t's is states[t - 1], step 0's `initial`."""
    return tf.cond(start > 0, lambda: states[start - 1:end - 1],
                   lambda: tf.concat([initial[None], states[:end - 1]], 0))


def _backward(x, h0, c0, w, u, b, activations, hs, cs, d_hs, d_c):
    """Gradients of x, h0, c0, W, U and the bias, from those of every h (`d_hs`) and of the last c."""
    steps, length, count = _blocks(x)
    features, units = x.shape[2] or tf.shape(x)[2], h0.shape[1] or tf.shape(h0)[1]
    dxs = tf.TensorArray(x.dtype, size=count, infer_shape=False)

    def block(j, dh, dc, dxs, dw, du, db):
        start = j * length
        end = tf.minimum(start + length, steps)
        x_block = _block(x, start, end, length)
        h_before = _with_steps(_before(hs, h0, start, end), length)
        c_before = _with_steps(_before(cs, c0, start, end), length)
        xw = _input_products(x_block, w)
        size = length if isinstance(length, int) else end - start  # static: the simulator sizes the list
        dzs = tf.TensorArray(x.dtype, size=size, element_shape=xw.shape[1:])

        def step(t, dh, dc, dzs):
            i = t - start
            z, c_in = _pre_activation(xw[i], h_before[i], u, b), c_before[i]
            with tf.GradientTape() as tape:
                tape.watch([z, c_in])
                h, c = _cell(z, c_in, activations)
            dz, dc_in = tape.gradient([h, c], [z, c_in], output_gradients=[dh + d_hs[t], dc])
            return t - 1, tf.matmul(dz, u, transpose_b=True), dc_in, dzs.write(i, dz)

        _, dh, dc, dzs = tf.while_loop(lambda t, *_: t >= start, step, (end - 1, dh, dc, dzs),
                                       parallel_iterations=1)
        dz = tf.reshape(_with_steps(dzs.stack(), length), [-1, 4 * units])
        dxs = dxs.write(j, tf.reshape(tf.matmul(dz, w, transpose_b=True), tf.shape(x_block)))
        sums = (tf.matmul(tf.reshape(x_block, [-1, features]), dz, transpose_a=True),
                tf.matmul(tf.reshape(h_before, [-1, units]), dz, transpose_a=True), tf.reduce_sum(dz, 0))
        if dw is not None:
            sums = (dw + sums[0], du + sums[1], db + sums[2])
        return (j - 1, dh, dc, dxs) + sums

    # The last block starts the weights' sums: zeros of their shapes would be folded by Grappler into
    # constants, which an instantiated function holds across steps (two per layer, [units, 4 x units] each).
    last = block(tf.convert_to_tensor(count - 1), tf.zeros_like(h0), d_c, dxs, None, None, None)
    # One block: no loop over the others (the simulator charges a loop one iteration, even where it runs none).
    if isinstance(count, int) and count == 1:
        _, dh0, dc0, dxs, dw, du, db = last
    else:
        _, dh0, dc0, dxs, dw, du, db = tf.while_loop(lambda j, *_: j >= 0, block, last, parallel_iterations=1)
    dx = dxs.concat()
    dx.set_shape(x.shape)
    return dx, dh0, dc0, dw, du, db
