"""Simulator accuracy on the emulated device (one compute stream): the README's table, asserted.

Each example is measured as it is and as `optimize` runs it (pinned to its
planned schedule, loops bounded to one iteration). The prediction must lie
within 15% of the peak of some measured step: pinned, the order is the
predicted one, but the BFC allocator hands a request a free chunk of up to
twice its size unsplit, and which chunks are free depends on the arena's
history, so the peak still varies (docs/results.md). The lstm example is
asserted pinned only: as it is, its gradient loop runs up to 32 iterations
ahead, and the simulator runs one.
"""

import pytest

from seqmem.examples.accuracy import DEFAULT_CASES, format_table, measure_accuracy


@pytest.mark.device
def test_predicted_peak_within_15_percent_of_a_measured_peak_as_is_and_pinned():
    rows = measure_accuracy(DEFAULT_CASES)
    print(format_table(rows))
    assert {(row.example, row.order) for row in rows} == {(name, order) for name, _ in DEFAULT_CASES
                                                          for order in ("as is", "pinned")}
    for row in rows:
        assert row.verdict == "ok", (row.example, row.verdict)
        if row.example == "lstm" and row.order == "as is":
            continue
        what = f"{row.example} batch {row.batch} {row.order}"
        assert abs(row.error_to_range) <= 0.15, f"{what}: {100 * row.error_to_range:+.1f}% vs the range"
