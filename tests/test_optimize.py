import math

import pytest
import tensorflow as tf

from seqmem.cli import train_example
from seqmem.device import run_with_budget
from seqmem.optimizer import optimize
from tests import optimize_jobs


@pytest.mark.parametrize("name, batch", [("mlp", 2048), ("cnn", 64), ("lstm", 32)])
def test_optimized_step_is_bit_identical_to_the_original(name, batch):
    run = run_with_budget(optimize_jobs.equivalence, name, batch, budget_mb=4096)
    assert run.ok, run.message
    swaps, same_losses, same_variables = run.value
    assert swaps > 0 and same_losses and same_variables


def test_step_that_ooms_trains_under_the_same_budget_with_seqmem():
    budget_mb = 170
    baseline = run_with_budget(train_example, "cnn", 128, budget_mb, False, budget_mb=budget_mb)
    assert baseline.verdict == "oom"
    optimized = run_with_budget(train_example, "cnn", 128, budget_mb, True, budget_mb=budget_mb)
    assert optimized.ok, optimized.message
    measured, summary = optimized.value
    assert measured <= budget_mb << 20
    assert "(fits)" in summary and "measured peak" in summary


def test_host_device_backend_on_two_logical_cpus():
    run = run_with_budget(optimize_jobs.host_device_backend_equivalence, budget_mb=4096)
    assert run.ok, run.message
    swaps, same_losses, host_devices = run.value
    assert swaps > 0 and same_losses and host_devices == ["/device:CPU:0"]


@pytest.mark.parametrize("budget", [0, -1, math.nan, math.inf, "12", None, True])
def test_bad_budgets_are_value_errors(budget):
    step = tf.function(lambda x: x)
    with pytest.raises(ValueError, match="memory_budget_mb"):
        optimize(step, budget)


def test_wrong_target_is_a_type_error():
    with pytest.raises(TypeError, match="tf.function, a ConcreteFunction, a tf.Graph or a GraphDef"):
        optimize(lambda x: x, 100)


def test_keras_fit_within_budget_matches_plain_fit_where_plain_fit_ooms():
    reference = run_with_budget(optimize_jobs.keras_fit, 128, budget_mb=4096)
    assert reference.ok, reference.message
    assert run_with_budget(optimize_jobs.keras_fit, 128, budget_mb=170).verdict == "oom"
    optimized = run_with_budget(optimize_jobs.keras_fit, 128, 170, budget_mb=170)
    assert optimized.ok, optimized.message
    assert optimized.value == reference.value


def test_fit_within_budget_needs_a_compiled_model():
    from seqmem.keras import fit_within_budget

    with pytest.raises(ValueError, match="compile the model"):
        fit_within_budget(tf.keras.Sequential([tf.keras.layers.Dense(2)]), 100)
