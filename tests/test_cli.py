"""The command line: argument errors, --help without TensorFlow, and `profile`/`plan` of a saved Keras model."""

import json
import os
import subprocess
import sys

import pytest

from seqmem.cli import main
from seqmem.swap.plan import SwapPlan


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
    ["demo", "--batch", "3"],
])
def test_bad_arguments_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: seqmem" in capsys.readouterr().err


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
    plan = SwapPlan.from_json(plan_json.read_text())
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
