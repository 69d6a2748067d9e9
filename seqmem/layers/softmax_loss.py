"""Memory-efficient softmax cross-entropy over a projection to a vocabulary.

A sequence model's loss projects features [..., H] to logits [..., V] and takes
the softmax cross-entropy against integer labels. Written with Keras' `Dense`
and `sparse_categorical_crossentropy`, training holds [rows, V] tensors at
once: the logits, the cross-entropy kernel's gradient (computed in the forward
pass and kept for backward), and the logits' gradient. For a language model
over 10000 words at 35 steps that is 1.4 MB a sentence each, where an LSTM
layer of 650 units keeps about 0.6 MB (7 [650] float32 tensors a step).

`projected_sparse_cross_entropy` computes the same per-position losses block
by block along the rows: each block's logits exist only while its loss is
computed, and the backward pass recomputes them block by block (one matrix
product more per block) to form that block's gradients. Neither pass holds
more than one block's [rows / blocks, V] tensors. The blocks run one after
another (control edges), also in backward, where each waits for the incoming
gradient so that no recomputation runs ahead of it.

`projected_mean_cross_entropy` is the form for a training step whose loss is
the (weighted) mean of those losses. A mean's gradient with respect to each
logit is known once that logit's block is computed, so it forms every gradient
in the forward pass, block by block, and keeps only them for backward: the
features' gradient [rows, H], the kernel's [H, V] and the bias's [V]. Backward
scales them by the incoming gradient. No logits are recomputed: the step does
the three products per block that the unblocked loss and its gradient do. The
gradients are computed even where nothing differentiates the loss (use
`projected_sparse_cross_entropy` to only evaluate it).

Values equal the unblocked computation up to float rounding: the kernel's and
the bias's gradients are summed block by block instead of in one product.
"""

from __future__ import annotations

import math

import tensorflow as tf

__all__ = ["block_bounds", "blocked_gradients", "blocked_losses", "projected_mean_cross_entropy",
           "projected_sparse_cross_entropy"]


def projected_sparse_cross_entropy(features, labels, kernel, bias=None, *, blocks: int = 8):
    """Per-position cross-entropy of softmax(features @ kernel + bias) against `labels`.

    features: float [..., H]; labels: integer [...], the leading shape of
    `features`, each in [0, V); kernel: [H, V] (a Keras `Dense` layer's
    `kernel`); bias: [V] or None. blocks: how many row blocks the
    [rows, V] logits are computed in (rows = the product of `labels`' shape).
    Returns float losses shaped like `labels`, equal to
    `tf.nn.sparse_softmax_cross_entropy_with_logits(labels, features @ kernel + bias)`
    up to float rounding, differentiable in `features`, `kernel` and `bias`.
    Raises ValueError for `blocks` below 1, non-float features, non-integer
    labels, or shapes that do not fit together.
    """
    flat_features, flat_labels, parameters, bounds = _flat_blocks(features, labels, kernel, bias, blocks)
    losses = _blocked_loss(flat_labels, bounds)(flat_features, *parameters)
    return tf.reshape(losses, tf.shape(labels))


def projected_mean_cross_entropy(features, labels, kernel, bias=None, *, weights=None, blocks: int = 8):
    """sum(weights * losses) / sum(weights), losses those of `projected_sparse_cross_entropy`; a scalar.

    weights: float, shaped like `labels` (e.g. a padding mask), not differentiated; None weighs every
    position alike (the plain mean). Every gradient is formed in the forward pass (see the module's
    docstring): differentiable in `features`, `kernel` and `bias`, once (no second derivatives).
    Raises ValueError as `projected_sparse_cross_entropy` does, and for weights of another shape or dtype.
    """
    labels = tf.convert_to_tensor(labels)
    flat_features, flat_labels, parameters, bounds = _flat_blocks(features, labels, kernel, bias, blocks)
    if weights is None:
        scale = tf.fill(tf.shape(flat_labels), 1.0 / tf.cast(tf.size(flat_labels), flat_features.dtype))
    else:
        weights = tf.convert_to_tensor(weights)
        if weights.dtype != flat_features.dtype or not weights.shape.is_compatible_with(labels.shape):
            raise ValueError(f"weights must be {flat_features.dtype.name} shaped like labels {labels.shape}, got "
                             f"{weights.dtype.name} {weights.shape}")
        flat_weights = tf.reshape(weights, [-1])
        scale = flat_weights / tf.reduce_sum(flat_weights)
    return _mean_loss(flat_labels, scale, bounds)(flat_features, *parameters)


def _flat_blocks(features, labels, kernel, bias, blocks):
    """Checked (features [rows, H], labels [rows], [kernel, bias?], row blocks' bounds)."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks must be a positive int, got {blocks!r}")
    features, labels, kernel = (tf.convert_to_tensor(t) for t in (features, labels, kernel))
    parameters = [kernel] if bias is None else [kernel, tf.convert_to_tensor(bias)]
    _check(features, labels, parameters)
    rows = labels.shape.num_elements()  # None when the labels' shape is not static
    flat_features = tf.reshape(features, [-1 if rows is None else rows, features.shape[-1]])
    flat_labels = tf.reshape(labels, [-1])
    bounds = block_bounds(rows if rows is not None else tf.shape(flat_labels)[0], blocks)
    return flat_features, flat_labels, parameters, bounds


def _check(features: tf.Tensor, labels: tf.Tensor, parameters: list[tf.Tensor]) -> None:
    if not features.dtype.is_floating:
        raise ValueError(f"features must be floating point, got {features.dtype.name}")
    if not labels.dtype.is_integer:
        raise ValueError(f"labels must be integer class ids, got {labels.dtype.name}")
    kernel = parameters[0]
    if kernel.shape.rank != 2 or features.shape.rank is None or features.shape.rank < 1:
        raise ValueError(f"features must be [..., H] and kernel [H, V], got {features.shape} and {kernel.shape}")
    if not features.shape[-1:].is_compatible_with(kernel.shape[:1]) or features.shape[-1] is None:
        raise ValueError(f"features' last dimension must be known and equal kernel's first: "
                         f"features {features.shape}, kernel {kernel.shape}")
    if not labels.shape.is_compatible_with(features.shape[:-1]):
        raise ValueError(f"labels must have features' leading shape {features.shape[:-1]}, got {labels.shape}")
    if len(parameters) == 2 and not parameters[1].shape.is_compatible_with(kernel.shape[1:]):
        raise ValueError(f"bias must be [V] = {kernel.shape[1:]}, got {parameters[1].shape}")
    if any(p.dtype != features.dtype for p in parameters):
        raise ValueError(f"kernel and bias must have features' dtype {features.dtype.name}, got "
                         f"{', '.join(p.dtype.name for p in parameters)}")


def block_bounds(rows, blocks: int) -> list[tuple]:
    """(start, end) of each row block: Python ints when `rows` is one, else scalar tensors."""
    if isinstance(rows, int):
        size = max(1, math.ceil(rows / blocks))
        return [(start, min(start + size, rows)) for start in range(0, rows, size)] or [(0, 0)]
    size = (rows + blocks - 1) // blocks
    return [(tf.minimum(i * size, rows), tf.minimum((i + 1) * size, rows)) for i in range(blocks)]


def _logits(features, parameters, after, transpose_kernel=False):
    """features @ kernel (+ bias), the product made only once every op in `after` has run; kernel [V, H]
    where `transpose_kernel` (a tied embedding)."""
    with tf.control_dependencies(after):
        logits = tf.matmul(features, parameters[0], transpose_b=transpose_kernel)
    return logits if len(parameters) == 1 else tf.nn.bias_add(logits, parameters[1])


def _block_gradients(features, labels, parameters, row_scale, after, transpose_kernel=False):
    """One block's (losses, features' gradient, [kernel's, bias's] gradients) for the logits' gradient
    (softmax - one_hot) * row_scale[:, None]; its logits made once every op in `after` has run."""
    logits = _logits(features, parameters, after, transpose_kernel)
    losses, softmax_minus_one_hot = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=logits, labels=labels)
    d_logits = softmax_minus_one_hot * row_scale[:, tf.newaxis]
    if transpose_kernel:
        d_parameters = [tf.matmul(d_logits, features, transpose_a=True)]
        d_features = tf.matmul(d_logits, parameters[0])
    else:
        d_parameters = [tf.matmul(features, d_logits, transpose_a=True)]
        d_features = tf.matmul(d_logits, parameters[0], transpose_b=True)
    if len(parameters) == 2:
        d_parameters.append(tf.reduce_sum(d_logits, axis=0))
    return losses, d_features, d_parameters


def _summed(totals: list, block: list) -> list:
    """The running sums of the parameters' gradients with one more block's added (None: no block yet)."""
    return [b if total is None else total + b for total, b in zip(totals, block)]


def blocked_losses(features, labels, parameters, bounds, *, transpose_kernel=False):
    """Cross-entropy losses [rows] of the row blocks `bounds` of features [rows, H] against labels [rows],
    one block's logits at a time. parameters: [kernel] or [kernel, bias]; kernel [H, V], or [V, H] where
    `transpose_kernel`. Not differentiable as such: `blocked_gradients` is its gradient."""
    losses, after = [], []
    for start, end in bounds:
        logits = _logits(features[start:end], parameters, after, transpose_kernel)  # one block's logits at a time
        loss, _ = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=logits, labels=labels[start:end])
        losses.append(loss)
        after = [loss]
    return tf.concat(losses, axis=0)


def blocked_gradients(features, labels, parameters, bounds, d_losses, *, transpose_kernel=False):
    """The gradients (features', kernel's[, bias's]) of `blocked_losses` for its incoming gradient d_losses
    [rows], recomputing each block's logits once d_losses exists, one block after another."""
    d_features, d_parameters = [], [None] * len(parameters)
    after = [d_losses]  # recompute only once the loss's gradient has arrived
    for start, end in bounds:
        _, d_block, block = _block_gradients(features[start:end], labels[start:end], parameters,
                                             d_losses[start:end], after, transpose_kernel)
        d_features.append(d_block)
        d_parameters = _summed(d_parameters, block)
        after = [d_block, *d_parameters]
    return (tf.concat(d_features, axis=0), *d_parameters)


def _blocked_loss(labels: tf.Tensor, bounds: list[tuple]):
    """The custom-gradient function (features [rows, H], kernel, [bias]) -> losses [rows]."""

    @tf.custom_gradient
    def blocked_loss(features, *parameters):
        def grad(d_losses):
            return blocked_gradients(features, labels, parameters, bounds, d_losses)

        return blocked_losses(features, labels, parameters, bounds), grad

    return blocked_loss


def _mean_loss(labels: tf.Tensor, scale: tf.Tensor, bounds: list[tuple]):
    """The custom-gradient function (features [rows, H], kernel, [bias]) -> sum(scale * losses), a scalar
    whose gradients are formed in the forward pass."""

    @tf.custom_gradient
    def mean_loss(features, *parameters):
        mean, d_features, d_parameters, after = None, [], [None] * len(parameters), []
        for start, end in bounds:
            losses, d_block, block = _block_gradients(features[start:end], labels[start:end], parameters,
                                                      scale[start:end], after)
            part = tf.reduce_sum(losses * scale[start:end])
            mean = part if mean is None else mean + part
            d_features.append(d_block)
            d_parameters = _summed(d_parameters, block)
            after = [d_block, *d_parameters]
        d_features = tf.concat(d_features, axis=0)

        def grad(d_mean):
            return (d_features * d_mean, *(d * d_mean for d in d_parameters))

        return mean, grad

    return mean_loss
