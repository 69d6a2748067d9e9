"""models.lm.benchmark: flags and the Table 2(a) report (the search itself is measured by hand, docs/results.md)."""

import pytest

from models.lm import benchmark


@pytest.mark.parametrize("argv", [["--layers", "1,x"], ["--layers", "0"], ["--budget-mb", "0"], ["--precision", "1"],
                                  ["--variants", "efficient"], ["--variants", "base,cells"], ["--nope"]])
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(argv)
    assert exit_info.value.code == 2 and "usage:" in capsys.readouterr().err


def test_report_gives_ratios_to_the_base_batch_and_the_notes():
    report = {"args": {"budget_mb": 1024, "units": 650, "time_steps": 35, "vocab": 10000, "runs": 1,
                       "executor": "one-stream"},
              "rows": [{"layers": 16, "batch": {"base": 10, "efficient": 25},
                        "notes": {"base": ["batch 20: crashed: Fatal Python error: Segmentation fault"]}}]}
    printed = benchmark.format_report(report)
    assert "trains two steps in a fresh process, real OOM, one stream" in printed
    assert "| 16 | 10 | - | 25 (2.50x) | - | - | - | - |" in printed
    assert "note (16 layers, base): batch 20: crashed" in printed
    assert "At B_base" not in printed  # no row was measured at B_base


def test_report_gives_each_variants_peak_and_throughput_at_the_base_batch():
    measured = {"peak_bytes": 200 << 20, "predicted_peak_bytes": 190 << 20, "swaps": 0, "tokens_per_s": 1000.0}
    report = {"args": {"budget_mb": 128, "units": 256, "time_steps": 35, "vocab": 1000},
              "rows": [{"layers": 4, "batch": {"base": 53, "swap": 145}, "notes": {},
                        "at_base": {"base": measured, "swap": {**measured, "swaps": 16, "tokens_per_s": 900.0},
                                    "both": {"error": "oom", "message": ""}}}]}
    printed = benchmark.format_report(report)
    assert "| 4 | 53 | 200 (190), 0 swaps, 1000 tok/s (1.00x) | 200 (190), 16 swaps, 900 tok/s (0.90x) | - | oom |" \
        in printed


def test_blocked_loss_step_trains_as_the_keras_step():
    import numpy as np

    losses = {}
    for loss in ("keras", "efficient"):
        step, inputs, _ = benchmark.training_step(4, layers=1, units=8, time_steps=5, vocab=30, loss=loss)
        losses[loss] = [float(step(*inputs)) for _ in range(3)]  # the same initial weights (seeded) and batch
    np.testing.assert_allclose(losses["efficient"], losses["keras"], rtol=1e-5)
    assert losses["keras"][2] < losses["keras"][0]  # SGD at rate 1 learns the fixed batch
