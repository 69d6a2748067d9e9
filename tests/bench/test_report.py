"""The benchmarks' report pieces: the median of several fresh-process measurements."""

import pytest

from seqmem.bench.report import measured_cell, median_run


def _cell(rate):
    return {"peak_bytes": 100 << 20, "predicted_peak_bytes": 98 << 20, "swaps": 2, "tokens_per_s": rate}


def test_median_run_keeps_the_middle_run_and_every_rate_in_run_order():
    runs = [_cell(300.0), {"error": "oom", "message": "OOM"}, _cell(100.0), _cell(200.0)]
    median = median_run(runs, "tokens_per_s")
    assert median["tokens_per_s"] == 200.0 and median["runs"] == runs
    assert measured_cell(median, "tokens_per_s", "tok/s", 400.0) == \
        "100 (98), 2 swaps, 200 tok/s (0.50x) [300 / 100 / 200]"
    # an even count: the lower middle run
    assert median_run([_cell(1.0), _cell(4.0), _cell(3.0), _cell(2.0)], "tokens_per_s")["tokens_per_s"] == 2.0


def test_median_run_of_failures_is_the_first_failure_and_of_nothing_an_error():
    failures = [{"error": "oom", "message": "a"}, {"error": "crashed", "message": "b"}]
    assert median_run(failures, "tokens_per_s") == {**failures[0], "runs": failures}
    with pytest.raises(ValueError, match="at least one"):
        median_run([], "tokens_per_s")
