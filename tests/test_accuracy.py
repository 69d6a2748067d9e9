"""Simulator accuracy on the emulated device: the README's table, asserted."""

from seqmem.accuracy import DEFAULT_CASES, format_table, measure_accuracy


def test_predicted_peak_within_15_percent_of_measured_bfc_peak():
    rows = measure_accuracy(DEFAULT_CASES)
    print(format_table(rows))
    for row in rows:
        assert row.verdict == "ok", (row.example, row.verdict)
        assert abs(row.error) <= 0.15, f"{row.example} batch {row.batch}: error {100 * row.error:+.1f}%"
