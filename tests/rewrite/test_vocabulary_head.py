"""The blocked vocabulary head (`seqmem.rewrite.vocabulary_head`, kind "blocked-head") on steps written here
from Keras layers and TensorFlow ops alone.

Tolerance: the blocked step's weights after one step, and its losses over three, equal the original's to
1e-5 relative: the head's kernel and bias gradients are summed block by block, in another order than one
product (about 1e-7 per step). Weights are compared after the first step only: a rounding difference that
flips a ReLU near zero moves the next steps' gradients by a whole unit's share, which is the model's
sensitivity, not the rewrite's error.
Run without op determinism: under it TensorFlow computes the cross-entropy in another form (named in the
plan's notes, tested below), and the blocked sums differ by rounding anyway.
"""

import numpy as np
import pytest
import tensorflow as tf

import seqmem
from seqmem.analyze.anatomy import analyze_step
from seqmem.edge import capture
from seqmem.decisions.plan import Plan
from seqmem.rewrite.vocabulary_head import find_heads

VOCABULARY, LENGTH, WIDTH, BATCH = 1000, 32, 32, 16


class _TransformerLM(tf.keras.Model):
    """One causal self-attention block over token embeddings and a projection to the vocabulary: Keras
    layers only. tied: the projection is the embedding matrix, transposed (no bias): over the features as
    rows [B x T, H] ("rows"), or batched over [B, T, H] as `tf.matmul` takes it ("batched")."""

    def __init__(self, tied) -> None:
        super().__init__()
        self.embedding = tf.keras.layers.Embedding(VOCABULARY, WIDTH)
        self.attention = tf.keras.layers.MultiHeadAttention(2, WIDTH // 2)
        self.norm = tf.keras.layers.LayerNormalization()
        self.feed_forward = tf.keras.layers.Dense(2 * WIDTH, activation="relu")
        self.back = tf.keras.layers.Dense(WIDTH)
        self.tied = tied
        self.projection = None if tied else tf.keras.layers.Dense(VOCABULARY)

    def call(self, tokens):
        x = self.embedding(tokens)
        x = self.norm(x + self.attention(x, x, use_causal_mask=True))
        x = x + self.back(self.feed_forward(x))
        if self.tied == "batched":
            return tf.matmul(x, self.embedding.embeddings, transpose_b=True)
        if self.tied:
            return tf.reshape(tf.matmul(tf.reshape(x, [-1, WIDTH]), self.embedding.embeddings, transpose_b=True),
                              [BATCH, LENGTH, VOCABULARY])
        return self.projection(x)


def _step(tied=False, masked: bool = False, accuracy: bool = False):
    """A training step (tokens, targets) -> loss of a fresh `_TransformerLM`, its weights seeded. Plain SGD:
    Adam's normalized update would turn a rounding difference in a near-zero gradient into one of up to its
    learning rate."""
    tf.keras.utils.set_random_seed(7)
    model = _TransformerLM(tied)
    optimizer = tf.keras.optimizers.SGD(0.5)
    loss_function = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(tokens, targets):
        with tf.GradientTape() as tape:
            logits = model(tokens)
            if masked:  # the mean over non-padding targets (id 0), TensorFlow's own cross-entropy
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)
                weights = tf.cast(targets > 0, tf.float32)
                loss = tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)
            else:
                loss = loss_function(targets, logits)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if accuracy:
            return loss, tf.reduce_mean(tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == targets, tf.float32))
        return loss

    return step, model


def _batches(count: int = 3):
    rng = np.random.default_rng(0)
    return [tuple(tf.constant(rng.integers(0, VOCABULARY, [BATCH, LENGTH]), tf.int32) for _ in range(2))
            for _ in range(count)]


def _search(step):
    graph = capture.from_tf(step.get_concrete_function(*_batches(1)[0]))
    return find_heads(graph, analyze_step(graph).backward)


def test_a_keras_dense_head_and_keras_loss_are_found():
    search = _search(_step()[0])
    assert search.unrecognized == ()
    (head,) = search.heads
    assert (head.rows, head.hidden, head.vocabulary) == (BATCH * LENGTH, WIDTH, VOCABULARY)
    assert not head.transpose_kernel and head.bias is not None
    assert None not in (head.d_features, head.d_kernel, head.d_bias)


@pytest.mark.parametrize("tied", ["rows", "batched"])
def test_a_tied_embedding_and_a_masked_mean_are_found(tied):
    (head,) = _search(_step(tied=tied, masked=True)[0]).heads
    assert head.transpose_kernel and head.bias is None and head.d_bias is None
    assert head.d_kernel is not None  # added to the embedding's own gradient by the step
    assert head.rows == BATCH * LENGTH and head.hidden == WIDTH


def test_logits_read_by_anything_else_are_not_blocked_and_the_reason_names_the_node():
    search = _search(_step(accuracy=True)[0])
    assert search.heads == ()
    (reason,) = search.unrecognized
    assert "ArgMax" in reason


def test_the_form_op_determinism_traces_is_named(op_determinism):
    search = _search(_step()[0])
    assert search.heads == ()
    assert any("op determinism" in reason and "LogSoftmax" in reason for reason in search.unrecognized)


@pytest.mark.parametrize("tied", [False, "rows", "batched"])
def test_the_blocked_step_trains_as_the_original_without_its_logits(tied):
    batches = _batches()
    step, model = _step(tied=tied, masked=tied)
    expected = [float(step(*batches[0]))]
    expected_weights = [w.numpy() for w in model.trainable_variables]  # after the first step
    expected += [float(step(*batch)) for batch in batches[1:]]

    step, model = _step(tied=tied, masked=tied)
    before = seqmem.optimize(step, 1e4, kinds=("blocked-head",), sample_inputs=batches[0]).plan
    logits_bytes = BATCH * LENGTH * VOCABULARY * 4
    budget_mb = (before.predicted_peak_before_bytes - logits_bytes // 2) / 2 ** 20  # the optimizer's peak below
    optimized = seqmem.optimize(step, budget_mb, kinds=("blocked-head",), sample_inputs=batches[0], safety_margin=0)
    (head,) = optimized.plan.blocked_heads
    assert optimized.plan.predicted_peak_after_bytes <= before.predicted_peak_before_bytes - logits_bytes // 2
    block_rows = -(-head.rows // head.blocks)
    largest = max(info.size_bytes or 0 for node in optimized.analysis.graph.nodes.values() for info in node.outputs
                  if VOCABULARY in (info.shape or ()) and info.shape not in ((WIDTH, VOCABULARY), (VOCABULARY, WIDTH)))
    assert largest <= block_rows * VOCABULARY * 4  # no [rows, V] or [B, V, H] tensor left, one block's at most
    assert Plan.from_json(optimized.plan.to_json()).blocked_heads == optimized.plan.blocked_heads
    assert "vocabulary head" in optimized.plan.summary()

    losses = [float(optimized(*batches[0]))]
    for actual, wanted in zip(model.trainable_variables, expected_weights):
        np.testing.assert_allclose(actual.numpy(), wanted, rtol=1e-5, atol=1e-7)
    losses += [float(optimized(*batch)) for batch in batches[1:]]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)


def test_without_the_kind_the_head_is_left_as_it_is():
    step, _ = _step()
    plan = seqmem.optimize(step, 1e4, sample_inputs=_batches(1)[0]).plan
    assert plan.blocked_heads == ()
