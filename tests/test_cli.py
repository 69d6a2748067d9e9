"""The command line: argument errors, --help without TensorFlow, every flag reaching the function its
subcommand runs, and each subcommand run (`profile`/`plan` of a saved Keras model, `accuracy`, `demo`)."""

import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from seqmem import cli
from seqmem.cli import main
from seqmem.decisions.plan import Plan


@pytest.mark.parametrize("argv", [
    ["frobnicate"],
    ["profile", "example:nope", "--batch", "1"],
    ["profile", "model.h5", "--batch", "1"],
    ["profile", "missing.keras", "--batch", "1"],
    ["profile", "example:mlp", "--batch", "1", "--at-peak", "0"],
    ["plan", "example:mlp", "--batch", "0", "--budget-mb", "5"],
    ["plan", "example:mlp", "--batch", "2"],
    ["plan", "example:mlp", "--batch", "2", "--budget-mb", "5", "--safety-margin", "1.5"],
    ["plan", "example:mlp", "--batch", "2", "--budget-mb", "5", "--kinds", "swap,fold"],
    ["plan", "example:mlp", "--batch", "2", "--budget-mb", "5", "--kinds", "compress"],
    ["plan", "example:mlp", "--batch", "2", "--budget-mb", "5", "--kinds", "compress", "--compression", "int8"],
    ["plan", "example:mlp", "--batch", "2", "--budget-mb", "5", "--host-memory-mb", "0"],
    ["plan", "example:mlp", "--batch", "2", "--budget-mb", "5", "--host-memory-mb", "lots"],
    ["accuracy", "--device-mb", "-3"],
    ["accuracy", "--case", "mlp:zero"],
    ["demo", "--batch", "0"],
    ["demo", "--precision", "1.5"],
    ["demo", "--budget"],
])
def test_bad_arguments_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: seqmem" in capsys.readouterr().err


_COMMANDS = ("accuracy_command", "largest_batches_command", "plan_command", "profile_command",
             "train_without_seqmem_command")


@pytest.fixture
def recorded(monkeypatch):
    """Each command function replaced by one that records its call, after checking that the call binds to
    the real function's signature (a flag or argument the real one lacks fails here)."""
    calls = []
    for name in _COMMANDS:
        real = getattr(cli, name)

        def record(*args, _name=name, _real=real, **kwargs):
            inspect.signature(_real).bind(*args, **kwargs)
            calls.append((_name, args, kwargs))
            return 0

        monkeypatch.setattr(cli, name, record)
    return calls


def test_every_flag_of_profile_plan_and_accuracy_reaches_its_function(recorded):
    assert main(["profile", "example:cnn", "--batch", "3", "--device-mb", "50", "--png", "c.png",
                 "--at-peak", "2"]) == 0
    assert recorded.pop() == ("profile_command", ("example:cnn", 3), dict(device_mb=50, png="c.png", at_peak=2))
    assert main(["plan", "example:mlp", "--batch", "8", "--budget-mb", "30", "--safety-margin", "0.2",
                 "--json", "p.json", "--png", "p.png", "--largest-batch", "--max-batch", "64",
                 "--kinds", "swap,compress", "--compression", "float16", "--host-memory-mb", "100"]) == 0
    (_, plan_args, plan_kwargs), (_, search_args, search_kwargs) = recorded[-2:]
    options = cli.ConservationOptions(("swap", "compress"), "float16")
    assert plan_args == ("example:mlp", 8, 30)
    assert plan_kwargs == dict(json_path="p.json", png="p.png", safety_margin=0.2, options=options,
                               host_memory_mb=100.0)
    assert search_args == ("example:mlp", 30)
    assert search_kwargs == dict(start=8, max_batch=64, safety_margin=0.2, options=options, host_memory_mb=100.0)
    recorded.clear()
    assert main(["plan", "example:mlp", "--batch", "8", "--budget-mb", "30"]) == 0
    assert [name for name, _, _ in recorded] == ["plan_command"]  # no search without --largest-batch
    assert main(["accuracy", "--case", "mlp:8", "--case", "cnn:4", "--device-mb", "64", "--concurrent-ops",
                 "--reserved-arena"]) == 0
    assert recorded.pop() == ("accuracy_command", ([("mlp", 8), ("cnn", 4)],),
                              dict(device_mb=64, one_stream=False, reserved_arena=True))


def test_the_demo_runs_its_stages_with_its_flags(recorded, tmp_path):
    assert main(["demo", "--out", str(tmp_path), "--batch", "48", "--budget-mb", "64", "--max-batch", "96",
                 "--precision", "0.5"]) == 0
    assert [name for name, _, _ in recorded] == ["profile_command", "train_without_seqmem_command",
                                                 "plan_command", "largest_batches_command"]
    _, (_, _, plan_kwargs), (_, search_args, search_kwargs) = recorded[1:]
    assert recorded[1][1] == ("example:resnet", 48, 64) and recorded[2][1] == ("example:resnet", 48, 64)
    assert plan_kwargs["json_path"] == str(tmp_path / "plan.json")
    assert search_args == ("example:resnet", 64)
    assert search_kwargs["start"] == 48 and search_kwargs["max_batch"] == 96 and search_kwargs["precision"] == 0.5


def test_help_does_not_start_tensorflow():
    code = ("import sys\nfrom seqmem.cli import main\ntry:\n    main(['plan', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'tensorflow' not in sys.modules, 'help imported TensorFlow'")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--budget-mb" in result.stdout and result.stderr == ""


def _saved_mlp(path, hidden_layers=6):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input([784])]
                                + [tf.keras.layers.Dense(1024, activation="relu") for _ in range(hidden_layers)]
                                + [tf.keras.layers.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.save(path)
    return str(path)


@pytest.mark.device
def test_profile_and_plan_a_saved_keras_model(tmp_path, capsys):
    # this MLP at batch 2048 predicts 148 MB as it is; pinned, with Keras' gradient barrier split, 120.2 MB before
    # any swap (2026-11-25), so a plan for 130 MB with a 10% margin must swap
    model = _saved_mlp(tmp_path / "mlp.keras")
    assert main(["profile", model, "--batch", "2048", "--png", str(tmp_path / "curve.png"), "--at-peak", "3"]) == 0
    printed = capsys.readouterr().out
    assert "predicted peak" in printed and "measured peak" in printed
    # the three largest buffers at each peak; at the measured one, the ops that allocated them (8 MB each:
    # [2048, 1024] float32 activations and their gradients)
    assert "live at the predicted peak, largest 3" in printed and "live at the measured peak" in printed
    measured_rows = printed.split("live at the measured peak")[1].splitlines()[1:4]
    assert len(measured_rows) == 3 and all(float(row.split()[0]) >= 8.0 for row in measured_rows), measured_rows
    plan_json = tmp_path / "plan.json"
    assert main(["plan", model, "--batch", "2048", "--budget-mb", "130", "--safety-margin", "0.1",
                 "--kinds", "swap,recompute", "--host-memory-mb", "4096", "--json", str(plan_json), "--png", str(tmp_path / "plan.png")]) == 0
    printed = capsys.readouterr().out
    assert "(fits)" in printed and "trained two steps with the plan" in printed
    plan = Plan.from_json(plan_json.read_text())
    assert plan.decisions and plan.budget_bytes == 130 << 20 and plan.options.kinds == ("swap", "recompute")
    assert plan.options.max_host_bytes == 4096 << 20
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert json.loads(plan_json.read_text())["target_bytes"] == plan.target_bytes
    assert sorted(os.listdir(tmp_path)) == ["curve.png", "mlp.keras", "plan.json", "plan.png"]


def test_a_model_saved_without_compile_is_refused(tmp_path):
    import tensorflow as tf

    from seqmem.runtime.keras import saved_model_step

    path = str(tmp_path / "raw.keras")
    tf.keras.Sequential([tf.keras.Input([3]), tf.keras.layers.Dense(2)]).save(path)
    with pytest.raises(ValueError, match="model.compile"):
        saved_model_step(4, path)
    with pytest.raises(FileNotFoundError, match="no saved model"):
        saved_model_step(4, str(tmp_path / "missing.keras"))


@pytest.mark.device
def test_accuracy_runs_a_built_in_step(capsys):
    assert main(["accuracy", "--case", "mlp:64"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| mlp | 64 |")]
    assert len(rows) == 2 and all(row.endswith("% |") for row in rows), printed  # pinned and as is, measured


@pytest.mark.device
@pytest.mark.slow
def test_the_demo_runs_end_to_end(tmp_path, capsys):
    # the smallest configuration that shows every stage: ResNet-14 at batch 48 does not train under 64 MB,
    # trains with a plan, and the searches (within 50%, at most 48) find B_base < B_opt
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--batch", "48", "--budget-mb", "64", "--max-batch", "48",
                 "--precision", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "measured peak" in printed and "without seqmem: oom" in printed
    assert "(fits)" in printed and "trained two steps with the plan" in printed
    found = re.search(r"largest batch under 64 MB \(within 50%\): without seqmem (\d+), with seqmem (\d+)", printed)
    assert found and 0 < int(found[1]) < int(found[2]) <= 48, printed
    assert sorted(os.listdir(out)) == ["memory-cnn.png", "plan-resnet.png", "plan.json"]
