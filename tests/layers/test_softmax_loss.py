import numpy as np
import pytest
import tensorflow as tf

from seqmem.layers.softmax_loss import projected_mean_cross_entropy, projected_sparse_cross_entropy

BATCH, STEPS, UNITS, VOCAB = 3, 5, 4, 13


def _data(seed=0):
    rng = np.random.default_rng(seed)
    features = tf.constant(rng.normal(size=(BATCH, STEPS, UNITS)), tf.float32)
    labels = tf.constant(rng.integers(0, VOCAB, (BATCH, STEPS)), tf.int32)
    kernel = tf.Variable(rng.normal(size=(UNITS, VOCAB)), dtype=tf.float32)
    bias = tf.Variable(rng.normal(size=(VOCAB,)), dtype=tf.float32)
    weights = tf.constant(rng.uniform(size=(BATCH, STEPS)), tf.float32)  # a non-uniform upstream gradient
    return features, labels, kernel, bias, weights


def _losses_and_gradients(loss_fn, features, labels, kernel, bias, weights):
    with tf.GradientTape() as tape:
        tape.watch(features)
        losses = loss_fn(features, labels, kernel, bias)
        total = tf.reduce_sum(losses * weights)
    sources = [features, kernel] + ([bias] if bias is not None else [])
    return [losses, *tape.gradient(total, sources)]


def _keras(features, labels, kernel, bias):
    logits = tf.matmul(features, kernel) + (0.0 if bias is None else bias)
    return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def _mean_and_gradients(loss_fn, features, labels, kernel, bias, weights):
    with tf.GradientTape() as tape:
        tape.watch(features)
        mean = loss_fn(features, labels, kernel, bias, weights)
        scaled = 3.0 * mean  # an incoming gradient other than 1
    sources = [features, kernel] + ([bias] if bias is not None else [])
    return [mean, *tape.gradient(scaled, sources)]


def _keras_mean(features, labels, kernel, bias, weights):
    losses = _keras(features, labels, kernel, bias)
    return tf.reduce_mean(losses) if weights is None else tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)


@pytest.mark.parametrize("blocks", [1, 2, 4, 15, 40])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("graph_mode", [False, True])
def test_losses_and_gradients_match_dense_and_keras_crossentropy(blocks, with_bias, graph_mode):
    features, labels, kernel, bias, weights = _data()
    bias = bias if with_bias else None
    ours = lambda *args: projected_sparse_cross_entropy(*args, blocks=blocks)  # noqa: E731
    run = tf.function(_losses_and_gradients) if graph_mode else _losses_and_gradients
    expected = run(_keras, features, labels, kernel, bias, weights)
    got = run(ours, features, labels, kernel, bias, weights)
    assert got[0].shape == labels.shape
    # float32; the kernel's and bias's gradients are summed block by block instead of in one product
    for name, a, b in zip(["losses", "features", "kernel", "bias"], expected, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("form", ["per position", "mean"])
def test_unknown_leading_dimensions_use_dynamic_blocks(form):
    features, labels, kernel, bias, weights = _data(1)
    signature = [tf.TensorSpec([None, None, UNITS], tf.float32), tf.TensorSpec([None, None], tf.int32)]
    if form == "mean":
        run, reference, weights = _mean_and_gradients, _keras_mean, None
        ours = lambda f, l, k, b, w: projected_mean_cross_entropy(f, l, k, b, blocks=4)  # noqa: E731
    else:
        run, reference = _losses_and_gradients, _keras
        ours = lambda *args: projected_sparse_cross_entropy(*args, blocks=4)  # noqa: E731

    @tf.function(input_signature=signature)
    def both(features, labels):
        return (run(reference, features, labels, kernel, bias, weights),
                run(ours, features, labels, kernel, bias, weights))

    expected, got = both(features, labels)
    for a, b in zip(expected, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_no_tensor_of_more_than_one_block_of_logits_in_forward_or_backward():
    rows, blocks = BATCH * STEPS, 5
    features, labels, kernel, bias, weights = _data(2)

    def largest_vocabulary_tensor(loss_fn):
        graph = tf.function(_losses_and_gradients).get_concrete_function(
            loss_fn, features, labels, kernel, bias, weights).graph
        sizes = [output.shape.num_elements() for op in graph.get_operations() for output in op.outputs
                 if output.shape.rank == 2 and output.shape[-1] == VOCAB and output.shape.is_fully_defined()]
        return max(sizes)

    ours = lambda *args: projected_sparse_cross_entropy(*args, blocks=blocks)  # noqa: E731
    assert largest_vocabulary_tensor(_keras) == rows * VOCAB
    # the kernel ([UNITS, VOCAB]) and its gradient are the largest left
    assert largest_vocabulary_tensor(ours) == max(rows // blocks, UNITS) * VOCAB


def test_backward_recomputation_waits_for_the_incoming_gradient():
    features, labels, kernel, bias, weights = _data(3)
    graph = tf.function(_losses_and_gradients).get_concrete_function(
        lambda *args: projected_sparse_cross_entropy(*args, blocks=3), features, labels, kernel, bias, weights).graph
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul" and not op.get_attr("transpose_a")
               and not op.get_attr("transpose_b")]
    forward, backward = matmuls[:3], matmuls[3:]
    assert len(backward) == 3
    assert not forward[0].control_inputs and all(op.control_inputs for op in forward[1:] + backward)
    # the first recomputation waits for the losses' gradient, the later ones for the block before
    assert backward[0].control_inputs[0].name.startswith("gradient_tape/")
    assert [op.type for op in forward[1].control_inputs] == ["SparseSoftmaxCrossEntropyWithLogits"]
    assert {op.type for op in backward[1].control_inputs} == {"MatMul", "Sum"}


@pytest.mark.parametrize("call, message", [
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, l, k, b, blocks=0), "blocks must be a positive int"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, l, k, b, blocks=2.0), "blocks must be a positive int"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, tf.cast(l, tf.float32), k, b), "labels must be integer"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(tf.cast(f, tf.int32), l, k, b), "features must be floating"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, l, k[:-1], b), "features' last dimension"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, l[:, :-1], k, b), "labels must have features' leading"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, l, k, b[:-1]), "bias must be"),
    (lambda f, l, k, b: projected_sparse_cross_entropy(f, l, tf.cast(k, tf.float64), None), "dtype"),
    (lambda f, l, k, b: projected_mean_cross_entropy(f, l, k, b, blocks=-1), "blocks must be a positive int"),
    (lambda f, l, k, b: projected_mean_cross_entropy(f, l[:, :-1], k, b), "labels must have features' leading"),
    (lambda f, l, k, b: projected_mean_cross_entropy(f, l, k, b, weights=tf.ones([BATCH])), "weights must be"),
    (lambda f, l, k, b: projected_mean_cross_entropy(f, l, k, b, weights=tf.ones(l.shape, tf.float64)),
     "weights must be float32"),
])
def test_bad_input_is_a_clear_error(call, message):
    features, labels, kernel, bias, _ = _data()
    with pytest.raises(ValueError, match=message):
        call(features, labels, tf.convert_to_tensor(kernel), tf.convert_to_tensor(bias))


@pytest.mark.parametrize("blocks", [1, 4, 40])
@pytest.mark.parametrize("with_bias, weighted", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("graph_mode", [False, True])
def test_mean_and_its_gradients_match_keras_mean_crossentropy(blocks, with_bias, weighted, graph_mode):
    features, labels, kernel, bias, weights = _data(4)
    bias, weights = (bias if with_bias else None), (weights if weighted else None)
    ours = lambda f, l, k, b, w: projected_mean_cross_entropy(f, l, k, b, weights=w, blocks=blocks)  # noqa: E731
    run = tf.function(_mean_and_gradients) if graph_mode else _mean_and_gradients
    expected = run(_keras_mean, features, labels, kernel, bias, weights)
    got = run(ours, features, labels, kernel, bias, weights)
    assert got[0].shape == []
    # float32; the mean and the parameters' gradients are summed block by block instead of in one reduction
    for name, a, b in zip(["mean", "features", "kernel", "bias"], expected, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)


def test_mean_forms_its_gradients_in_forward_and_recomputes_no_logits():
    rows, blocks = BATCH * STEPS, 5
    features, labels, kernel, bias, weights = _data(6)
    graph = tf.function(_mean_and_gradients).get_concrete_function(
        lambda f, l, k, b, w: projected_mean_cross_entropy(f, l, k, b, blocks=blocks),
        features, labels, kernel, bias, None).graph
    operations = graph.get_operations()
    # per block the unblocked loss's three products: logits, features' and kernel's gradients; none in backward
    assert sum(op.type == "MatMul" for op in operations) == 3 * blocks
    assert not any(op.type == "MatMul" and op.name.startswith("gradient_tape/") for op in operations)
    assert sum(op.type == "SparseSoftmaxCrossEntropyWithLogits" for op in operations) == blocks
    sizes = [output.shape.num_elements() for op in operations for output in op.outputs
             if output.shape.rank == 2 and output.shape[-1] == VOCAB]
    assert max(sizes) == max(rows // blocks, UNITS) * VOCAB  # one block of logits at a time, or the kernel
