"""models.lm.benchmark: flags, the Table 2(a) report and --at-batch (the searches are measured in docs/results.md)."""

import json

import pytest

from models.lm import benchmark


@pytest.mark.parametrize("argv", [["--layers", "1,x"], ["--layers", "0"], ["--budget-mb", "0"], ["--precision", "1"],
                                  ["--variants", "efficient"], ["--variants", "base,cells"], ["--nope"],
                                  ["--at-batch", "0"], ["--measure-runs", "0"]])
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


def test_efficient_loss_step_trains_as_the_keras_step():
    import numpy as np

    losses = {}
    for loss in ("keras", "efficient"):
        step, inputs, _ = benchmark.training_step(4, layers=1, units=8, time_steps=5, vocab=30, loss=loss)
        losses[loss] = [float(step(*inputs)) for _ in range(3)]  # the same initial weights (seeded) and batch
    np.testing.assert_allclose(losses["efficient"], losses["keras"], rtol=1e-5)
    assert losses["keras"][2] < losses["keras"][0]  # SGD at rate 1 learns the fixed batch


def test_at_a_given_batch_each_variant_is_measured_in_alternating_fresh_processes(tmp_path, monkeypatch, capsys):
    from seqmem.runtime.device import BudgetRun

    calls = []

    def fake_run_with_budget(function, variant, batch, *args, budget_mb, timeout_s, one_stream):
        calls.append((function.__name__, variant, batch, args, budget_mb, one_stream))
        rate = {"base": 1000.0, "loss": 950.0 + len(calls)}[variant]
        return BudgetRun("ok", value={"peak_bytes": 300 << 20, "predicted_peak_bytes": 290 << 20, "swaps": 0,
                                      "median_step_s": 1.0, "tokens_per_s": rate})

    monkeypatch.setattr(benchmark, "run_with_budget", fake_run_with_budget)
    argv = ["--layers", "1", "--at-batch", "272", "--measure-runs", "2", "--variants", "loss,base",
            "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    # no batch search: base and loss alternate, two rounds, at the batch given, in twice the budget, one stream
    model = (1, 650, 35, 10000, 1024)
    assert calls == [("measure", variant, 272, model, 2048, True) for _ in range(2) for variant in ("base", "loss")]
    (row,) = json.loads((tmp_path / "lm-benchmark.json").read_text())["rows"]
    assert row["batch"] == {} and row["measured_at"] == 272
    assert [run["tokens_per_s"] for run in row["at_base"]["loss"]["runs"]] == [952.0, 954.0]
    printed = capsys.readouterr().out
    assert "Table 2(a)" not in printed and "At the batch given" in printed
    assert "| 1 | 272 | 300 (290), 0 swaps, 1000 tok/s (1.00x) [1000 / 1000] | - | - | - |" in printed
    assert "952 tok/s (0.95x) [952 / 954]" in printed  # the lower middle of two runs
    assert not (tmp_path / "lm-batch.png").exists()
