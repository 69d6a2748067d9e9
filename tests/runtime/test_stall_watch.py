import time

import pytest

from seqmem.runtime.stall_watch import StallWatch, expected_idle


def _busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_idle_process_is_reported_once():
    stalls = []
    with StallWatch(stalls.append, idle_s=0.5):
        time.sleep(1.5)
    assert len(stalls) == 1 and stalls[0] >= 0.25


def test_busy_process_and_expected_waits_are_not_stalls():
    stalls = []
    with StallWatch(stalls.append, idle_s=0.5):
        _busy(1.0)
        with expected_idle():
            time.sleep(1.0)
        _busy(0.3)
    assert stalls == []


def test_idle_s_must_be_positive():
    with pytest.raises(ValueError, match="idle_s"):
        StallWatch(print, idle_s=0)
