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
    floor = {"op": "g", "op_type": "MatMul", "peak_bytes": 8 << 20, "persistent_bytes": 3 << 20,
             "working_bytes": 4 << 20, "held_bytes": 1 << 20,
             "largest_held": [{"tensor": "h:0", "size_bytes": 1 << 20, "why": "computed in backward"}]}
    row["optimized"][0]["floor"] = floor
    assert ("floor 8.0 MB at MatMul 'g': 3.0 live through the step + 4.0 the op's working set + 1.0 held; "
            "largest held h:0, 1.0 MB (computed in backward)") in zoo._markdown_row(row, 2)
    row["budget_mb"] = 6  # what lives through the step and the op's working set alone do not fit
    assert ("floor 8.0 MB at MatMul 'g': 3.0 live through the step + 4.0 the op's working set + 1.0 held (the first "
            "two, 7.0 MB, over the budget: the step's working set); largest held h:0") in zoo._markdown_row(row, 2)
    row["budget_mb"] = 7
    row["optimized"][0]["unplaced"] = "the allocator model cannot place the step's buffers in the 7.0 MB arena"
    assert "not placed (ran out of memory as the allocator model foresaw); floor 8.0 MB at MatMul 'g'" in (
        zoo._markdown_row(row, 2))
    row["optimized"][0]["unplaced"] = None
    floor.update(until="update", until_type="If", largest_held=[
        {"tensor": "h:0", "size_bytes": 1 << 20, "why": "an input of If 'update', a function call: it takes ..."}])
    assert ("floor 8.0 MB at MatMul 'g' until If 'update': 3.0 live through the step + 4.0 the op's working set + "
            "1.0 held; largest held h:0, 1.0 MB (an input of If 'update', a function call)") in zoo._markdown_row(row, 2)


def test_the_table_shows_the_range_of_the_originals_calls_beside_the_prediction():
    original = {"peak_bytes": 12 << 20, "peaks": [11 << 20, 12 << 20, 10 << 20], "predicted_peak_bytes": 9 << 20,
                "loss": "Mean:0", "loss_correct": True, "losses": [1.0], "digest": "d", "step_s": 1.0}
    row = {"model": "m", "family": "f", "batch": 4, "budget_mb": 8, "original": original, "optimized": []}
    assert "| Mean:0 (yes) | 10.0-12.0 (9.0) | 8 |" in zoo._markdown_row(row, 1)


def test_the_table_names_the_sums_an_original_adds_as_their_terms_arrive():
    original = {"peak_bytes": 10 << 20, "predicted_peak_bytes": 9 << 20, "loss": "Mean:0", "loss_correct": True,
                "losses": [1.0], "digest": "d", "step_s": 1.0}
    rows = [{"model": name, "family": "f", "batch": 4, "budget_mb": 7, "original": dict(original, arrival_sums=sums),
             "optimized": []} for name, sums in (("a", ["AddN_2"]), ("b", []))]
    assert zoo.markdown(rows, 1).splitlines()[-1].endswith("graph order): a (AddN_2).")


def test_the_table_names_the_originals_whose_calls_all_returned_one_loss():
    original = {"peak_bytes": 10 << 20, "predicted_peak_bytes": 9 << 20, "loss": "Mean:0", "loss_correct": True,
                "digest": "d", "step_s": 1.0}
    rows = [{"model": name, "family": "f", "batch": 4, "budget_mb": 7, "original": dict(original, losses=losses),
             "optimized": []} for name, losses in (("a", [3.5, 3.5, 3.5]), ("b", [3.5, 3.25, 3.0]), ("c", [1.0]))]
    assert zoo.markdown(rows, 1).splitlines()[-1] == (
        "Originals whose calls all returned one loss (the calls' updates skipped, as a loss scale that overflows "
        "skips them, or without effect on it; bit for bit then compares no update): a.")


def test_the_table_counts_the_originals_further_runs_that_repeat_its_first():
    original = {"peak_bytes": 10 << 20, "predicted_peak_bytes": 9 << 20, "loss": "Mean:0", "loss_correct": True,
                "losses": [1.0], "digest": "d", "step_s": 1.0}
    again = [dict(original), dict(original, losses=[1.5]), {"verdict": "oom", "message": ""}]
    rows = [{"model": "a", "family": "f", "batch": 4, "budget_mb": 7, "original": original, "optimized": [],
             "original_again": again}, {"model": "b", "family": "f", "batch": 4, "budget_mb": 7,
                                        "original": original, "optimized": []}]
    assert zoo.markdown(rows, 1).splitlines()[-1] == (
        "Further fresh runs of the original whose losses and variables equal its first run's: a 1/3.")


def test_the_original_runs_again_in_fresh_jobs_before_the_optimized_ones(monkeypatch):
    from seqmem.runtime.device import BudgetRun

    jobs_run = []
    original = {"peak_bytes": 10 << 20, "predicted_peak_bytes": 9 << 20, "loss": "Mean:0", "loss_correct": True,
                "losses": [1.0], "digest": "d", "step_s": 1.0}

    def run_with_budget(job, *args, budget_mb, **kwargs):
        jobs_run.append((job.__name__, budget_mb))
        return BudgetRun("ok", value=dict(original))

    monkeypatch.setattr(zoo, "run_with_budget", run_with_budget)
    row = zoo.run_model("resnet50", 4, 0.7, 1, 1, original_runs=3)
    assert jobs_run == [("original", 4096)] * 3 + [("optimized", 7)]
    assert zoo._same_as_original(row) == 2


@pytest.mark.parametrize("reserved", [False, True])
def test_every_job_gets_the_arena_asked_for(reserved, monkeypatch):
    from seqmem.runtime import fork_server
    from seqmem.runtime.device import BudgetRun
    from models.zoo import workers

    arenas = []
    original = {"peak_bytes": 10 << 20, "predicted_peak_bytes": 9 << 20, "losses": [1.0], "digest": "d"}
    monkeypatch.setattr(zoo, "run_with_budget", lambda job, *args, reserved_arena, **kwargs: arenas.append(
        reserved_arena) or BudgetRun("ok", value=dict(original)))
    zoo.run_model("resnet50", 4, 0.7, 2, 1, reserved_arena=reserved)
    assert arenas == [reserved] * 3  # the original, then each optimized run

    forked = []
    monkeypatch.setattr(fork_server, "run_forked", lambda target, argv, env, folder, timeout_s: forked.append(
        ("--reserved-arena" in argv, "SEQMEM_RESERVED_ARENA" in env)))
    workers.run_workers("small_cnn", 4, 64, None, 1, reserved_arena=reserved)
    assert forked == [(reserved, reserved)] * 2


@pytest.mark.parametrize("argv, named", [(["--models", "resnet50,no_such_model"], "no_such_model"),
                                         (["--runs", "0"], "--runs"), (["--steps", "-1"], "--steps"),
                                         (["--fraction", "1.5"], "--fraction"),
                                         (["--original-runs", "0"], "--original-runs"),
                                         (["--models", "mobilenet_v2_2_workers", "--original-runs", "2"],
                                          "--original-runs")])
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


def test_two_workers_show_as_one_row_with_the_higher_peak_and_any_difference():
    from models.zoo.workers import _both

    same = {"losses": [1.0], "digest": "d", "plan_digest": "p", "peak_bytes": 5, "predicted_peak_bytes": 4}
    merged = _both([same, dict(same, peak_bytes=7)])
    assert merged["peak_bytes"] == 7 and merged["digest"] == "d"
    assert _both([dict(same, peaks=[5, 3]), dict(same, peaks=[4, 6])])["peaks"] == [5, 6]
    assert _both([same, dict(same, plan_digest="q")])["plan_digest"] == "workers differ"
    failed = _both([same, {"error": "UnavailableError", "message": "aborted"}])
    assert failed == {"verdict": "UnavailableError", "message": "worker 1: aborted"}
    assert "infeasible" in _both([{"infeasible": "floor", "optimize_s": 1.0}, same])


def test_the_data_parallel_step_is_a_zoo_model(capsys, tmp_path):
    with pytest.raises(SystemExit):
        zoo.main(["--models", "mobilenet_v2_2_workers,no_such_model", "--out", str(tmp_path / "zoo")])
    refused = capsys.readouterr().err
    assert "unknown models no_such_model;" in refused and "mobilenet_v2_2_workers" in refused.split(";")[1]


@pytest.mark.parametrize("argv", [["--workers", "1,x"], ["--workers", "0"], ["--budget-mb", "0"], ["--precision", "1"],
                                  ["--model", "vgg"], ["--opt-start", "0"]])
def test_the_worker_batch_search_refuses_bad_flags_before_anything_runs(argv, capsys, tmp_path):
    from models.zoo import worker_batches

    with pytest.raises(SystemExit):
        worker_batches.main(argv + ["--out", str(tmp_path / "out")])
    assert "usage:" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--batch", "0"], ["--model", "vgg"]])
def test_the_workers_run_refuses_bad_flags_before_anything_runs(argv, capsys, monkeypatch):
    from models.zoo import workers

    monkeypatch.setattr(workers, "run_workers", lambda *args, **kwargs: pytest.fail("a worker was started"))
    with pytest.raises(SystemExit):
        workers.main(argv)
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("results, raised", [
    ([{"losses": [1.0, 0.5]}, {"losses": [1.0, 0.5]}], None),
    ([{"error": "ResourceExhaustedError", "message": "OOM when allocating"},
      {"error": "UnavailableError", "message": "Collective ops is aborted by: OOM when allocating"}], "ResourceExhaustedError"),
    ([{"infeasible": "smallest achievable peak is 9.0 MB"}, {"losses": [1.0, 0.5]}], "InfeasibleBudgetError"),
    ([{"error": "exit 1", "message": "Traceback\nValueError: bad"}, {"losses": [1.0]}], "RuntimeError"),
])
def test_a_worker_probe_fails_as_its_workers_did(results, raised, monkeypatch):
    from models.zoo import worker_batches

    calls = []
    monkeypatch.setattr(worker_batches, "run_workers", lambda *args, **kwargs: calls.append((args, kwargs)) or results)
    if raised is None:
        assert worker_batches.trains_on_workers(8, "small_cnn", 64, True, 2)
    else:
        with pytest.raises(Exception) as error:
            worker_batches.trains_on_workers(8, "small_cnn", 64, False, 2)
        assert type(error.value).__name__ == raised
    (args, kwargs), = calls
    assert args[:5] == ("small_cnn", 8, 64, 64 if raised is None else None, 2)
    assert kwargs == {"workers": 2, "reserved_arena": False}


def test_grappler_off_names_only_grappler_optimizers_and_only_single_process_steps(capsys):
    with pytest.raises(SystemExit) as stopped:
        zoo.main(["--models", "mobilenet_v2", "--grappler-off", "arithmetic_optimization,folding"])
    assert stopped.value.code == 2
    assert "unknown Grappler optimizers folding; expected some of arithmetic_optimization" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        zoo.main(["--models", "mobilenet_v2_2_workers", "--grappler-off", "arithmetic_optimization"])
    assert stopped.value.code == 2
    assert "--grappler-off is for the single-process steps" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not supported for the data-parallel step"):
        zoo.run_model("mobilenet_v2_2_workers", 4, 0.7, 1, 1, grappler_off=("remapping",))
