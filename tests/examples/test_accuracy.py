"""Simulator accuracy on the emulated device (one compute stream): the README's table, asserted.

Each example is measured as it is and pinned to its planned schedule (what
`optimize` runs). The prediction must lie within 15% of the peak of some
measured step: pinned, the order is the predicted one, but the BFC allocator
hands a request a free chunk of up to twice its size unsplit, and which chunks
are free depends on the arena's history, so the peak still varies (docs/results.md).
Loops (the lstm example) are left out: their gradient loop runs up to 32
iterations ahead, which the simulator does not model yet (issue 13).
"""

import pytest

from seqmem.examples.accuracy import DEFAULT_CASES, format_table, measure_accuracy

_CASES = [(name, batch) for name, batch in DEFAULT_CASES if name != "lstm"]


@pytest.mark.device
def test_predicted_peak_within_15_percent_of_a_measured_peak_as_is_and_pinned():
    rows = measure_accuracy(_CASES)
    print(format_table(rows))
    assert {row.order for row in rows} == {"as is", "pinned"}
    for row in rows:
        assert row.verdict == "ok", (row.example, row.verdict)
        what = f"{row.example} batch {row.batch} {row.order}"
        assert abs(row.error_to_range) <= 0.15, f"{what}: {100 * row.error_to_range:+.1f}% vs the range"
