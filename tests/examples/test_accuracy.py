"""Simulator accuracy on the emulated device (one compute stream): the README's table, asserted.

Each example is measured as `optimize` runs it (pinned to its planned schedule, loops bounded to one
iteration) and as it is. Pinned, each step runs in the predicted order, its inputs in the arena
(`seqmem.runtime.device.on_device`), and in 4 processes each example's median was the same to 0.1 MB, within
3.2% of the prediction (the lstm's; docs/results.md, "Simulator accuracy"); its peak varied under 3% from
step to step (at most the lstm's, 70.1-72.0 MB; held to 3%, the issue's bound for step-to-step spread). As they are,
predicted in the order a profiled call ran in, the cnn and resnet are held to 15% of the peak of some measured
step: that order can differ from one process to the next (not within one), and the allocator model's peak
with it. The mlp as it is is not held to a figure: its peak varies from step to step in one process
(45.0-55.0 MB). Nor is the lstm: its gradient loop runs up to 32 iterations ahead, and the simulator runs one.
"""

import pytest

from seqmem.examples.accuracy import DEFAULT_CASES, format_table, measure_accuracy


@pytest.mark.device
def test_predicted_peak_within_5_percent_of_the_median_pinned_and_15_percent_of_a_step_as_is():
    rows = measure_accuracy(DEFAULT_CASES)
    print(format_table(rows))
    assert {(row.example, row.order) for row in rows} == {(name, order) for name, _ in DEFAULT_CASES
                                                          for order in ("as is", "pinned")}
    for row in rows:
        assert row.verdict == "ok", (row.example, row.verdict)
        what = f"{row.example} batch {row.batch} {row.order}"
        if row.order == "pinned":
            assert abs(row.error) <= 0.05, f"{what}: {100 * row.error:+.1f}% vs the median"
            low, high = row.measured_range_bytes
            assert high <= 1.03 * low, f"{what}: steps' peaks {low}-{high} bytes"
        elif row.example in ("cnn", "resnet"):
            assert abs(row.error_to_range) <= 0.15, f"{what}: {100 * row.error_to_range:+.1f}% vs the range"
