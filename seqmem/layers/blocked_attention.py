"""Dot-product attention in blocks of queries and keys, its probabilities recomputed in backward.

Keras' `MultiHeadAttention` forms the [B, N, T, S] scores, their softmax and, in training, the dropped-out
probabilities, and keeps the probabilities (and the dropout mask) for backward: N * T * S numbers per
example and layer, held from the layer's forward pass to its backward. `blocked_attention` computes the same
output a block of queries and a block of keys at a time with an online softmax (Milakov & Gimelshein 2018;
Dao et al., FlashAttention): each query row keeps its running maximum and sum, and its output is rescaled as
blocks of keys arrive. For backward it keeps its inputs, its output and each row's log-sum-exp ([B, N, T]);
backward recomputes each block's probabilities from them once the incoming gradient has arrived (a control
edge: no layer recomputes ahead and holds its blocks while later layers' gradients are formed). Besides
inputs, outputs and their gradients, no tensor larger than one block's [B, N, query_block, key_block] scores
exists at a time: memory O(T * d) instead of O(N * T * S). The blocks run one after another (a
`tf.while_loop`, one iteration at a time; a single block runs without a loop). Where the block sizes are
not given, both are the largest power of two whose block holds at most `BLOCK_SCORES` numbers for the
call's batch and heads: every block op then does enough work to amortize the executor's fixed cost per op,
and the blocks stay far below the [B, N, T, S] tensors Keras keeps at the lengths where blocking matters.

Masks are applied as Keras' softmax applies them: a masked score gets -1e9 added (the float16 minimum in
float16), so a row with every key masked attends to all keys alike, as in Keras. Dropout drops
probabilities, as Keras' does, with masks drawn statelessly from `seed` and the block's position, so
backward recomputes the masks forward drew. Values equal the unblocked computation's up to float rounding
(each row's softmax sum is taken block by block).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

__all__ = ["AttentionMask", "BLOCK_SCORES", "blocked_attention", "default_block"]

BLOCK_SCORES = 1 << 22
"""Numbers in one block's scores [B, N, query_block, key_block] at most, where block sizes are not given
(16 MiB in float32)."""

_BLOCK_SIZES = tuple(2 ** k for k in range(4, 12))  # what default_block chooses from: 16 .. 2048


class AttentionMask(NamedTuple):
    """Which keys each query may attend to, as factors that are combined one block at a time (Keras
    combines them into one [B, T, S] tensor). Each is a bool tensor or None (no constraint):
    queries [B, T] (False: a padded query), keys [B, S] (False: a padded key), pairs [B or 1, T, S]
    (an explicit `attention_mask`); causal: query t attends to keys 0..t only."""

    queries: Optional[tf.Tensor] = None
    keys: Optional[tf.Tensor] = None
    pairs: Optional[tf.Tensor] = None
    causal: bool = False

    def block(self, query_start, query_end, key_start, key_end) -> Optional[tf.Tensor]:
        """Bool [B or 1, 1, queries, keys] (broadcast over heads) for one block; None where all may attend."""
        visible = []
        if self.queries is not None:
            visible.append(self.queries[:, query_start:query_end, tf.newaxis])
        if self.keys is not None:
            visible.append(self.keys[:, tf.newaxis, key_start:key_end])
        if self.pairs is not None:  # a dimension of 1 (e.g. a [B, 1, S] padding mask) broadcasts, as in Keras
            queries = slice(None) if self.pairs.shape[1] == 1 else slice(query_start, query_end)
            keys = slice(None) if self.pairs.shape[2] == 1 else slice(key_start, key_end)
            visible.append(self.pairs[:, queries, keys])
        if self.causal:
            rows = tf.range(query_start, query_end)[:, tf.newaxis]
            visible.append((rows >= tf.range(key_start, key_end)[tf.newaxis, :])[tf.newaxis])
        if not visible:
            return None
        combined = visible[0]
        for factor in visible[1:]:
            combined = tf.logical_and(combined, factor)
        return combined[:, tf.newaxis]


def blocked_attention(query, key, value, mask: Optional[AttentionMask] = None, *, dropout_rate: float = 0.0,
                      seed=None, query_block: Optional[int] = None, key_block: Optional[int] = None):
    """softmax(query . key + mask) . value, per head, computed in blocks (module docstring).

    query: float [B, T, N, H], already scaled (Keras scales by 1 / sqrt(key_dim)); key: [B, S, N, H];
    value: [B, S, N, Hv], all one dtype (float16 and bfloat16 are computed in float32). mask: an
    `AttentionMask` or None. dropout_rate: in [0, 1), the fraction of probabilities dropped; seed: an int32
    or int64 [2] tensor, required when dropout_rate > 0 (the same seed draws the same masks).
    query_block, key_block: rows of queries and of keys per block; None: `default_block` of the batch and
    heads (the batch may be known only when the step runs). Returns [B, T, N, Hv] in query's dtype,
    differentiable in query, key and value (once: no second derivatives).
    Raises ValueError for block sizes below 1, a rate outside [0, 1), a missing seed, or inputs whose
    ranks, dtypes or shapes do not fit together.
    """
    query, key, value = (tf.convert_to_tensor(t) for t in (query, key, value))
    _check(query, key, value, dropout_rate, seed, query_block, key_block)
    dtype = query.dtype
    if dtype in (tf.float16, tf.bfloat16):
        query, key, value = (tf.cast(t, tf.float32) for t in (query, key, value))
    if query_block is None or key_block is None:
        block = default_block(_length(query, 0) * _length(query, 2))
        query_block, key_block = query_block or block, key_block or block
    scores = _Scores(mask or AttentionMask(), _Dropout(dropout_rate, seed), query_block, key_block,
                     negative=tf.float16.min if dtype == tf.float16 else -1e9)
    return tf.cast(_attention(scores)(query, key, value), dtype)


def default_block(examples):
    """The largest of 16, 32, .., 2048 with examples * block * block <= BLOCK_SCORES (16 where none fits):
    the block size for `examples` = batch * heads rows of scores; a Python int for an int, an int32 scalar
    tensor for a tensor."""
    if isinstance(examples, int):
        return max([size for size in _BLOCK_SIZES if examples * size * size <= BLOCK_SCORES], default=_BLOCK_SIZES[0])
    sizes = tf.constant(_BLOCK_SIZES, tf.int64)
    fits = tf.cast(examples, tf.int64) * sizes * sizes <= BLOCK_SCORES
    return tf.cast(tf.reduce_max(tf.where(fits, sizes, _BLOCK_SIZES[0])), tf.int32)


def _check(query, key, value, dropout_rate, seed, query_block, key_block) -> None:
    for name, size in (("query_block", query_block), ("key_block", key_block)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"{name} must be a positive int or None, got {size!r}")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}")
    if dropout_rate > 0.0 and seed is None:
        raise ValueError("dropout needs a seed: pass seed, an int32 or int64 tensor of shape [2]")
    if any(t.shape.rank != 4 for t in (query, key, value)):
        raise ValueError(f"query, key and value must be [B, T, heads, H], got shapes {query.shape}, "
                         f"{key.shape} and {value.shape}")
    if not query.dtype.is_floating or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"query, key and value must share one float dtype, got {query.dtype.name}, "
                         f"{key.dtype.name} and {value.dtype.name}")
    if not (query.shape[-1:].is_compatible_with(key.shape[-1:])
            and key.shape[:3].is_compatible_with(value.shape[:3])
            and query.shape[::2].is_compatible_with(key.shape[::2])):
        raise ValueError(f"shapes do not fit: query {query.shape} [B, T, N, H], key {key.shape} [B, S, N, H], "
                         f"value {value.shape} [B, S, N, Hv]")


class _Dropout(NamedTuple):
    """Dropout of one block's probabilities, its mask a function of the seed and the block's position.
    Each probability gets 16 random bits (one 32-bit Philox number serves two; masks are drawn twice, in
    forward and again in backward), so the rate applied is `rate` rounded to a multiple of 1 / 65536, and
    `scale` matches it."""

    rate: float
    seed: Optional[tf.Tensor]

    @property
    def _dropped_of_65536(self) -> int:
        return min(round(self.rate * 65536), 65535)

    def kept(self, probabilities, position):
        """The block's bool mask of kept probabilities (None without dropout), drawn from the seed and the
        block's position, so backward draws what forward drew."""
        if self.rate == 0.0:
            return None
        block_seed = tf.random.experimental.stateless_fold_in(self.seed, position)
        shape = tf.shape(probabilities)
        keys = shape[-1]
        pairs = tf.random.stateless_uniform(tf.concat([shape[:-1], [(keys + 1) // 2]], 0), block_seed,
                                            dtype=tf.uint32, minval=None, maxval=None)
        bits = tf.reshape(tf.bitcast(pairs, tf.uint16), tf.concat([shape[:-1], [-1]], 0))[..., :keys]
        return bits >= tf.constant(self._dropped_of_65536, tf.uint16)

    def zeroed(self, values, kept):
        """values with the dropped ones zero; the kept ones are not scaled (`scale` is applied to the
        [.., T, H] factors of the products instead of to every [.., T, S] block)."""
        if kept is None:
            return values
        # a scalar zero: Grappler folds zeros_like of a static shape into a constant each step keeps
        return tf.where(kept, values, tf.zeros([], values.dtype))

    @property
    def scale(self) -> float:
        """What a kept probability is multiplied by: 1 / (1 - the rate applied)."""
        return 65536 / (65536 - self._dropped_of_65536)


class _Scores(NamedTuple):
    """How one block's scores are formed: the mask, the dropout and the block sizes."""

    mask: AttentionMask
    dropout: _Dropout
    query_block: int  # or an int32 scalar tensor (a batch known only when the step runs)
    key_block: int
    negative: float

    def key_blocks_seen(self, query_end, key_blocks):
        """How many key blocks, from the first, the queries before `query_end` attend to: under a causal
        mask alone, those starting before query_end (a block wholly above the diagonal adds exp(-1e9 - max)
        = 0 to every row, each row seeing key 0, so it is skipped); otherwise all."""
        if not self._causal_alone():
            return key_blocks
        return _minimum(key_blocks, _blocks(query_end, self.key_block))

    def first_query_block_seeing(self, key_start):
        """The first query block that attends to keys from `key_start` on (`key_blocks_seen`'s converse)."""
        return key_start // self.query_block if self._causal_alone() else 0

    def _causal_alone(self) -> bool:
        mask = self.mask
        return mask.causal and mask.queries is None and mask.keys is None and mask.pairs is None

    def of(self, query_rows, key_rows, query_start, key_start):
        """Masked scores [B, N, queries, keys] of heads-first query and key rows starting at those positions."""
        scores = tf.matmul(query_rows, key_rows, transpose_b=True)
        visible = self.mask.block(query_start, query_start + _length(query_rows, 2),
                                  key_start, key_start + _length(key_rows, 2))
        if visible is None:
            return scores
        return scores + tf.cast(tf.logical_not(visible), scores.dtype) * self.negative


def _length(tensor, axis: int):
    """The size of `axis`: a Python int where the shape says it, else a scalar tensor."""
    size = tensor.shape[axis]
    return size if size is not None else tf.shape(tensor)[axis]


def _minimum(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else tf.minimum(a, b)


def _bounds(index, block: int, length):
    """(start, end) of block `index` of a sequence of `length` cut in blocks of `block`."""
    start = index * block
    return start, _minimum(start + block, length)


def _loop(start, stop, body, loop_vars: tuple) -> tuple:
    """loop_vars after body(i, *loop_vars) -> loop_vars for i in [start, stop), one iteration at a time (a
    `tf.while_loop`); where the bounds are Python ints at most one apart, the body is called directly."""
    if isinstance(start, int) and isinstance(stop, int) and stop - start <= 1:
        return body(start, *loop_vars) if start < stop else loop_vars
    return tuple(tf.while_loop(lambda i, *_: i < stop, lambda i, *state: (i + 1, *body(i, *state)),
                               (tf.constant(start) if isinstance(start, int) else start, *loop_vars),
                               parallel_iterations=1)[1:])


def _heads_first(rows):
    """[B, t, N, ...] -> [B, N, t, ...]."""
    return tf.transpose(rows, [0, 2, 1, 3] if rows.shape.rank == 4 else [0, 2, 1])


def _sequence_first(rows):
    """[B, N, t, ...] -> [t, B, N, ...] (what a TensorArray concatenates along its first axis)."""
    return tf.transpose(rows, [2, 0, 1, 3] if rows.shape.rank == 4 else [2, 0, 1])


def _blocks(length, block: int):
    """How many blocks of `block` cover `length` (a Python int where `length` is one)."""
    return (length + block - 1) // block


def _attention(scores: _Scores):
    """The custom-gradient function (query, key, value) -> output, all in Keras' [B, T, N, H] layout."""

    @tf.custom_gradient
    def attention(query, key, value):
        output, log_sum_exp = _forward(scores, query, key, value)

        def grad(d_output):
            with tf.control_dependencies([d_output]):  # recompute only once the incoming gradient has arrived
                return _backward(scores, query, key, value, output, log_sum_exp, d_output)

        return output, grad

    return attention


def _forward(scores: _Scores, query, key, value):
    """(output [B, T, N, Hv], log-sum-exp [B, T, N]) with an online softmax over key blocks."""
    length, key_length = _length(query, 1), _length(key, 1)
    query_blocks, key_blocks = _blocks(length, scores.query_block), _blocks(key_length, scores.key_block)
    output_shape = query.shape[:3].concatenate(value.shape[3:])  # [B, T, N, Hv]: what backward's loops start from
    query, key, value = _heads_first(query), _heads_first(key), _heads_first(value)  # once, not per block

    def query_step(i, outputs, log_sum_exps):
        start, end = _bounds(i, scores.query_block, length)
        rows = query[:, :, start:end]
        row_shape = tf.shape(rows)[:3]
        maximum = tf.fill(row_shape, tf.constant(-float("inf"), rows.dtype))
        total = tf.zeros(row_shape, rows.dtype)
        weighted = tf.zeros(tf.concat([row_shape, tf.shape(value)[3:]], 0), rows.dtype)

        def key_step(j, maximum, total, weighted):
            key_start, key_end = _bounds(j, scores.key_block, key_length)
            block = scores.of(rows, key[:, :, key_start:key_end], start, key_start)
            new_maximum = tf.maximum(maximum, tf.reduce_max(block, axis=-1))
            probabilities = tf.exp(block - new_maximum[..., tf.newaxis])
            rescale = tf.exp(maximum - new_maximum)
            total = total * rescale + tf.reduce_sum(probabilities, axis=-1)
            dropped = scores.dropout.zeroed(probabilities, scores.dropout.kept(probabilities, i * key_blocks + j))
            weighted = weighted * rescale[..., tf.newaxis] + tf.matmul(dropped, value[:, :, key_start:key_end])
            return new_maximum, total, weighted

        maximum, total, weighted = _loop(0, scores.key_blocks_seen(end, key_blocks), key_step,
                                         (maximum, total, weighted))
        dropout_scale = scores.dropout.scale
        if dropout_scale != 1.0:
            weighted = weighted * dropout_scale
        return (outputs.write(i, _sequence_first(weighted / total[..., tf.newaxis])),
                log_sum_exps.write(i, _sequence_first(maximum + tf.math.log(total))))

    arrays = (tf.TensorArray(query.dtype, size=query_blocks, infer_shape=False),
              tf.TensorArray(query.dtype, size=query_blocks, infer_shape=False))
    outputs, log_sum_exps = _loop(0, query_blocks, query_step, arrays)
    output, log_sum_exp = tf.transpose(outputs.concat(), [1, 0, 2, 3]), tf.transpose(log_sum_exps.concat(), [1, 0, 2])
    output.set_shape(output_shape)
    log_sum_exp.set_shape(output_shape[:3])
    return output, log_sum_exp


def _backward(scores: _Scores, query, key, value, output, log_sum_exp, d_output):
    """(d_query, d_key, d_value): each block's probabilities recomputed from the log-sum-exp, key blocks
    outside, query blocks inside. A key block's gradients are summed in the inner loop; a query block's
    gradient is a list element that each key block adds its part to (replacing an element does not copy
    the others, as adding into one [T, ...] tensor would)."""
    length, key_length = _length(query, 1), _length(key, 1)
    query_blocks, key_blocks = _blocks(length, scores.query_block), _blocks(key_length, scores.key_block)
    row_dot = _heads_first(tf.reduce_sum(d_output * output, axis=-1))  # [B, N, T]: sum_j p_ij dp_ij of each row
    # heads first once, not per block; d_output times the dropout's scale (the kept probabilities' factor)
    query, key, value = _heads_first(query), _heads_first(key), _heads_first(value)
    d_output = _heads_first(d_output if scores.dropout.scale == 1.0 else d_output * scores.dropout.scale)
    log_sum_exp = _heads_first(log_sum_exp)

    def key_step(j, d_queries, d_keys, d_values):
        key_start, key_end = _bounds(j, scores.key_block, key_length)
        key_rows, value_rows = key[:, :, key_start:key_end], value[:, :, key_start:key_end]

        def query_step(i, d_queries, d_key, d_value):
            start, end = _bounds(i, scores.query_block, length)
            rows, d_rows = query[:, :, start:end], d_output[:, :, start:end]
            block = scores.of(rows, key_rows, start, key_start)
            probabilities = tf.exp(block - log_sum_exp[:, :, start:end, tf.newaxis])
            kept = scores.dropout.kept(probabilities, i * key_blocks + j)  # drawn once for both products
            d_value += tf.matmul(scores.dropout.zeroed(probabilities, kept), d_rows, transpose_a=True)
            d_probabilities = scores.dropout.zeroed(tf.matmul(d_rows, value_rows, transpose_b=True), kept)
            d_block = probabilities * (d_probabilities - row_dot[:, :, start:end, tf.newaxis])
            d_key += tf.matmul(d_block, rows, transpose_a=True)
            # every query block sees key block 0 first (a causal mask skips only later ones)
            d_queries = _added(d_queries, i, _sequence_first(tf.matmul(d_block, key_rows)), first=j == 0)
            return d_queries, d_key, d_value

        d_queries, d_key, d_value = _loop(scores.first_query_block_seeing(key_start), query_blocks, query_step,
                                          (d_queries, tf.zeros_like(key_rows), tf.zeros_like(value_rows)))
        return d_queries, d_keys.write(j, _sequence_first(d_key)), d_values.write(j, _sequence_first(d_value))

    arrays = (tf.TensorArray(query.dtype, size=query_blocks, infer_shape=False),
              tf.TensorArray(key.dtype, size=key_blocks, infer_shape=False),
              tf.TensorArray(value.dtype, size=key_blocks, infer_shape=False))
    return tuple(tf.transpose(array.concat(), [1, 0, 2, 3]) for array in _loop(0, key_blocks, key_step, arrays))


def _added(array: tf.TensorArray, index, part, first) -> tf.TensorArray:
    """`array` with `part` added into element `index`; first (a bool, or a bool tensor): the element has no
    value yet, and becomes `part`."""
    if isinstance(first, bool):
        return array.write(index, part if first else array.read(index) + part)
    return array.write(index, tf.cond(first, lambda: part, lambda: array.read(index) + part))
