import pytest

from seqmem.analyze.critical_path import Timing
from seqmem.ir.graph import TensorInfo
from seqmem.sim.scratch import scratch_bytes_of, static_scratch_bytes, with_concurrent_scratch
from tests.builders import graph, node


def _filter_grad(batch, rows, channels_in, channels_out, kernel=3):
    images = TensorInfo("float32", (batch, rows, rows, channels_in), 4 * batch * rows * rows * channels_in)
    grad = TensorInfo("float32", (batch, rows, rows, channels_out), 4 * batch * rows * rows * channels_out)
    filters = TensorInfo("float32", (kernel, kernel, channels_in, channels_out), 4 * kernel * kernel * channels_in * channels_out)
    return graph(node("x", "Placeholder", outputs=(images,)), node("sizes", "Const", outputs=(16,)),
                 node("dy", "Placeholder", outputs=(grad,)),
                 node("g", "Conv2DBackpropFilter", ["x", "sizes", "dy"], outputs=(filters,)))


def test_filter_gradient_scratch_is_an_im2col_buffer_of_a_shard_of_images():
    g = _filter_grad(batch=2, rows=8, channels_in=3, channels_out=4)
    # small images: the whole batch is one shard; buffer = batch x pixels x (3 x 3 x 3) floats
    assert scratch_bytes_of(g, g.node("g")) == 2 * 64 * 27 * 4
    big = _filter_grad(batch=512, rows=32, channels_in=64, channels_out=64)
    # large images: a shard of images spans about 32 MiB of work elements, whatever the batch
    assert 8 << 20 < scratch_bytes_of(big, big.node("g")) < 64 << 20
    assert static_scratch_bytes(big) == {"g": scratch_bytes_of(big, big.node("g"))}


def test_unknown_shapes_and_other_ops_need_no_scratch():
    g = _filter_grad(batch=2, rows=8, channels_in=3, channels_out=4)
    assert scratch_bytes_of(g, g.node("x")) == 0
    unknown = graph(node("x", "Placeholder", outputs=(TensorInfo("float32", (None, 8, 8, 3), None),)),
                    node("s", "Const"), node("dy", "Placeholder", outputs=(TensorInfo("float32", (None, 8, 8, 4), None),)),
                    node("g", "Conv2DBackpropFilter", ["x", "s", "dy"], outputs=(TensorInfo("float32", (3, 3, 3, 4), 432),)))
    assert scratch_bytes_of(unknown, unknown.node("g")) == 0


def _timing(intervals):
    start = {name: a for name, (a, _) in intervals.items()}
    completion = {name: b for name, (_, b) in intervals.items()}
    zero = {name: 0.0 for name in intervals}
    return Timing(zero, start, completion, completion, zero, {}, max(completion.values()), ())


def test_concurrent_scratch_charges_the_largest_overlapping_ops():
    timing = _timing({"a": (0.0, 2.0), "b": (1.0, 3.0), "c": (1.5, 2.5), "d": (5.0, 6.0)})
    scratch = {"a": 100, "b": 10, "c": 1, "d": 1000}
    assert with_concurrent_scratch(scratch, timing, inter_op_threads=1) == scratch
    assert with_concurrent_scratch(scratch, timing, inter_op_threads=2) == {"a": 110, "b": 110, "c": 101, "d": 1000}
    assert with_concurrent_scratch(scratch, timing, inter_op_threads=3) == {"a": 111, "b": 111, "c": 111, "d": 1000}
    with pytest.raises(ValueError, match="inter_op_threads"):
        with_concurrent_scratch(scratch, timing, inter_op_threads=0)
