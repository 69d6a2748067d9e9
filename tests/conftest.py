"""Test set-up: the test process itself runs on the plain CPU (no emulated device);
tests that measure memory do it in fresh processes through seqmem.runtime.device."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
