"""Test set-up: the test process itself runs on the plain CPU (no emulated device);
tests that measure memory do it in fresh processes through seqmem.runtime.device."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


@pytest.fixture
def op_determinism():
    """Deterministic kernels for one test (to compare a rewritten step with the original exactly), then the
    process's setting as it was: left on, every later unseeded random op in the same process (an xdist
    worker runs many test files) raises."""
    from tensorflow.python.framework import config  # the public API cannot turn it off again

    was_enabled = config.is_op_determinism_enabled()
    config.enable_op_determinism()
    yield
    if not was_enabled:
        config.disable_op_determinism()
