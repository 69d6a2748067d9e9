"""seqmem.edge.allocation_trace: the allocator's events of one step, replayed."""

import pytest

from seqmem.edge.allocation_trace import AllocationTrace, AllocatorEvent
from seqmem.runtime.device import run_with_budget

_MIB = 1 << 20


def _event(allocated, address, size, in_use, op="a"):
    return AllocatorEvent(allocated, address, size, op, "", in_use)


def test_replay_lists_what_is_live_after_an_event_and_sums_it_by_op():
    trace = AllocationTrace((
        _event(True, 1, 100, 1100),          # 1000 bytes in use before the call
        _event(True, 2, 300, 1400, op="b"),
        _event(False, 1, 100, 1300),
        _event(True, 3, 50, 1350, op="b"),
        _event(False, 2, 300, 1050),
    ))
    assert trace.in_use_before_bytes == 1000 and trace.peak_index == 1
    assert [e.address for e in trace.live_after(trace.peak_index)] == [1, 2]
    assert AllocationTrace.bytes_by_op(trace.live_after(3)) == [("b", 350, 2)]
    with pytest.raises(ValueError, match="no allocator events"):
        AllocationTrace(()).peak_index


def traced_wide_intermediate():
    """Child process: the allocator's events of a step whose 4 MiB intermediate is live at its peak."""
    import tensorflow as tf

    from seqmem.edge.allocation_trace import trace_allocations

    @tf.function
    def step(x):
        wide = tf.tile(x, [1, 1024], name="wide")  # [1024, 1024] float32: 4 MiB
        return tf.reduce_sum(tf.matmul(wide, wide))

    trace = trace_allocations(step, [tf.ones([1024, 1])])
    peak = trace.peak_index
    return (trace.events[peak].in_use_bytes - trace.in_use_before_bytes,
            AllocationTrace.bytes_by_op(trace.live_after(peak)),
            tf.config.experimental.get_memory_info("CPU:0")["peak"])


@pytest.mark.device
def test_the_traced_peak_holds_the_ops_own_buffers():
    run = run_with_budget(traced_wide_intermediate, budget_mb=256)
    assert run.ok, run.message
    over_start, by_op, arena_peak = run.value
    assert 8 * _MIB <= over_start <= arena_peak  # the tiled copy and the product, 4 MiB each
    sizes = {op.rsplit("/", 1)[-1]: size for op, size, _ in by_op}
    assert sizes["wide"] >= 4 * _MIB and sizes["MatMul"] >= 4 * _MIB, by_op
