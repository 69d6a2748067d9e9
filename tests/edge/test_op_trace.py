import tensorflow as tf

from seqmem.edge.op_trace import trace_ops


def test_the_trace_times_each_op_and_lists_ops_in_the_order_they_started():
    @tf.function
    def step(x):
        doubled = tf.multiply(x, 2.0, name="doubled")
        product = tf.matmul(doubled, doubled, name="product")
        return tf.reduce_sum(product, name="total")

    ran = trace_ops(step, [tf.ones([64, 64])], runs=2)
    assert ran.seconds["product"] > 0
    started = [name for name in ran.started if name in ("doubled", "product", "total")]
    assert started == ["doubled", "product", "total"]
    assert len(set(ran.started)) == len(ran.started)  # each op once, at its first start
