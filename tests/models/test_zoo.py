"""models/zoo: steps the project did not write build and train; the quick subset, optimized to 70% of each
step's measured peak, finds the loss the step returns, trains within the budget and bit for bit."""

import json

import pytest

from models.zoo import __main__ as zoo
from models.zoo.steps import STEPS


def test_the_zoo_holds_at_least_14_steps_of_7_families():
    assert len(STEPS) >= 14
    assert len({model.family for model in STEPS.values()}) >= 7


def test_the_table_shows_a_failed_run_and_a_floor():
    row = {"model": "m", "family": "f", "batch": 4, "budget_mb": 7,
           "original": {"peak_bytes": 10 << 20, "predicted_peak_bytes": 9 << 20, "loss": "Mean:0", "loss_correct": True,
                        "losses": [1.0], "digest": "d", "step_s": 1.0},
           "optimized": [{"infeasible": "smallest achievable peak is 8.0 MB", "optimize_s": 2.0},
                         {"verdict": "oom", "message": "stopped after 2.0 s idle"}]}
    line = zoo._markdown_row(row, 2)
    assert "infeasible: smallest achievable peak is 8.0 MB" in line and "oom" in line
    assert "| 0/2 | 0/2 |" in line


@pytest.mark.parametrize("argv, named", [(["--models", "resnet50,no_such_model"], "no_such_model"),
                                         (["--runs", "0"], "--runs"), (["--steps", "-1"], "--steps"),
                                         (["--fraction", "1.5"], "--fraction")])
def test_bad_arguments_are_refused_before_anything_runs(argv, named, capsys, tmp_path):
    with pytest.raises(SystemExit):
        zoo.main(argv + ["--out", str(tmp_path / "zoo")])
    assert named in capsys.readouterr().err
    assert not (tmp_path / "zoo").exists()


@pytest.mark.device
def test_the_quick_zoo_trains_within_the_budget_bit_for_bit(tmp_path):
    assert zoo.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "zoo.json").read_text())["rows"]
    assert {row["model"] for row in rows} == {name for name, model in STEPS.items() if model.quick_batch}
    for row in rows:
        shown = zoo.verdicts(row)
        assert shown["loss_correct"], row["original"]
        assert shown["within_budget"] == 1 and shown["bit_for_bit"] == 1, row["optimized"]
