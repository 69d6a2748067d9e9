import os

import pytest
import tensorflow as tf

from seqmem.errors import NoBackwardPassError, UnknownShapeError
from seqmem.examples.steps import build_example
from seqmem.runtime.profile import profile


@pytest.fixture(scope="module")
def mlp():
    return build_example("mlp", 16)


def test_profile_predicts_without_measuring_on_plain_cpu(mlp):
    result = profile(mlp.step, *mlp.input_specs)
    assert result.measured_peak_bytes is None
    dense = 16 * 1024 * 4
    # three hidden activations are kept for the backward pass
    assert sum(1 for f in result.feature_maps if f.size_bytes == dense) >= 3
    assert result.predicted_peak_bytes > result.memory.busiest().persistent_bytes > 0
    assert "predicted peak" in result.summary()


def test_profile_leaves_variables_unchanged_when_it_runs_the_step(mlp):
    before = [v.numpy().copy() for v in mlp.model.variables]
    result = profile(mlp.step, *mlp.make_inputs(1), costs="measured")
    assert result.timing.makespan_s > 0
    for old, variable in zip(before, mlp.model.variables):
        assert (old == variable.numpy()).all()


def test_plot_writes_a_png(mlp, tmp_path):
    path = profile(mlp.step, *mlp.input_specs).plot(str(tmp_path / "curve.png"))
    with open(path, "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["curve.png"]


def test_bad_inputs_get_clear_errors(mlp):
    with pytest.raises(TypeError, match="tf.function or a ConcreteFunction"):
        profile(lambda x: x, tf.zeros([2]))
    with pytest.raises(UnknownShapeError, match="unknown dimensions"):
        profile(mlp.step, tf.TensorSpec([None, 784]), tf.TensorSpec([None], tf.int32))
    with pytest.raises(UnknownShapeError, match="input_signature"):
        profile(mlp.step)
    with pytest.raises(ValueError, match="costs must be"):
        profile(mlp.step, *mlp.input_specs, costs="guess")

    @tf.function
    def forward_only(x):
        return tf.reduce_sum(x * 2.0)

    with pytest.raises(NoBackwardPassError, match="loss="):
        profile(forward_only, tf.TensorSpec([3]))
