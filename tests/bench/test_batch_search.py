"""The batch search's logic, with the fresh-process runner replaced by a fake device of known capacity."""

import traceback

import pytest

from seqmem.bench import batch_search
from seqmem.errors import InfeasibleBudgetError
from seqmem.runtime.device import BudgetRun


def _fake_device(capacity: int, crash_at=frozenset()):
    probed = []

    def run_with_budget(probe, batch, *args, budget_mb, timeout_s, one_stream, stall_s):
        probed.append(batch)
        if batch in crash_at:
            return BudgetRun("crashed", message="exit status -11 (SIGSEGV)\nUnable to register cuBLAS factory")
        if batch > capacity:
            return BudgetRun("oom", message="OOM")
        try:
            return BudgetRun("ok", value=probe(batch))
        except Exception:  # what the child reports for any other exception
            return BudgetRun("error", message=traceback.format_exc())

    return run_with_budget, probed


@pytest.mark.parametrize("capacity, start, limit", [(0, 1, 64), (1, 1, 64), (37, 1, 64), (64, 1, 64), (100, 1, 64),
                                                    (37, 50, 64), (37, 8, 64), (5, 5, 5)])
def test_finds_the_largest_batch_that_fits(monkeypatch, capacity, start, limit):
    fake, probed = _fake_device(capacity)
    monkeypatch.setattr(batch_search, "run_with_budget", fake)
    found = batch_search.largest_batch(lambda batch: {"batch": batch}, budget_mb=1, limit=limit, start=start)
    assert found.batch == min(capacity, limit)
    assert max(probed) <= limit
    assert all(found.values[b] == {"batch": b} for b in found.values)
    assert found.notes == []


def test_precision_stops_early_within_the_bound(monkeypatch):
    exact_fake, exact_probes = _fake_device(700)
    monkeypatch.setattr(batch_search, "run_with_budget", exact_fake)
    assert batch_search.largest_batch(bool, budget_mb=1, limit=2048).batch == 700
    rough_fake, rough_probes = _fake_device(700)
    monkeypatch.setattr(batch_search, "run_with_budget", rough_fake)
    rough = batch_search.largest_batch(bool, budget_mb=1, limit=2048, precision=0.05).batch
    assert 700 * 0.95 <= rough <= 700
    assert len(rough_probes) < len(exact_probes)


def test_batches_already_tried_are_not_probed_again(monkeypatch):
    fake, probed = _fake_device(37)
    monkeypatch.setattr(batch_search, "run_with_budget", fake)
    found = batch_search.largest_batch(bool, budget_mb=1, limit=64, start=48, known={48: False, 24: True})
    assert found.batch == 37 and 48 not in probed and 24 not in probed and probed


def test_a_crashing_probe_counts_as_not_fitting_and_is_noted(monkeypatch):
    fake, _ = _fake_device(40, crash_at={32})
    monkeypatch.setattr(batch_search, "run_with_budget", fake)
    found = batch_search.largest_batch(bool, budget_mb=1, limit=64)
    assert found.batch == 31
    assert found.notes == ["batch 32: crashed: exit status -11 (SIGSEGV)"]  # the status, not stderr's last line


def test_a_batch_fits_only_when_it_trains_in_every_run(monkeypatch):
    calls = {}

    def flaky_device(probe, batch, *args, budget_mb, timeout_s, one_stream, stall_s):  # batch 40 trains in its first run only
        calls[batch] = calls.get(batch, 0) + 1
        fits = batch <= 39 or (batch == 40 and calls[batch] == 1)
        return BudgetRun("ok", value=True) if fits else BudgetRun("oom", message="OOM")

    monkeypatch.setattr(batch_search, "run_with_budget", flaky_device)
    found = batch_search.largest_batch(bool, budget_mb=1, limit=64, runs=3)
    assert found.batch == 39 and 40 not in found.values
    assert calls[39] == 3 and calls[40] == 2 and calls[64] == 1  # stops at the first run that fails
    assert found.notes == ["batch 40, run 2 of 3: oom: OOM"]


def test_a_probe_without_a_plan_does_not_fit_and_is_noted_with_the_reason(monkeypatch):
    def no_plan_above_20(batch):
        if batch > 20:
            raise InfeasibleBudgetError(f"smallest achievable peak is {batch}.0 MB (Mul 'x'); planned for 1.0 MB")
        return True

    fake, _ = _fake_device(64)
    monkeypatch.setattr(batch_search, "run_with_budget", fake)
    found = batch_search.largest_batch(no_plan_above_20, budget_mb=1, limit=64, start=16)
    assert found.batch == 20
    assert found.notes[0] == ("batch 32: error: seqmem.errors.InfeasibleBudgetError: smallest achievable peak is "
                              "32.0 MB (Mul 'x'); planned for 1.0 MB")
    assert [note.split(":")[0] for note in found.notes] == ["batch 32", "batch 24", "batch 22", "batch 21"]


def test_a_falsy_result_does_not_fit(monkeypatch):
    fake, _ = _fake_device(64)
    monkeypatch.setattr(batch_search, "run_with_budget", fake)
    assert batch_search.largest_batch(lambda batch: batch <= 10, budget_mb=1, limit=64).batch == 10


@pytest.mark.parametrize("kwargs", [dict(limit=0), dict(limit=8, start=9), dict(limit=8, start=0),
                                    dict(limit=8, precision=1.0), dict(limit=8, runs=0)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        batch_search.largest_batch(bool, budget_mb=1, **kwargs)


def test_extrapolated_batch_is_where_an_affine_peak_meets_the_budget():
    assert batch_search.extrapolated_batch(110, 120, 200) == 10  # 100 + 10 * batch
    assert batch_search.extrapolated_batch(110, 120, 199) == 9
    assert batch_search.extrapolated_batch(500, 600, 200) == 1  # even batch 1 is over: start at 1
    assert batch_search.extrapolated_batch(100, 100, 10_000) > 1_000  # no growth measured: far out, not a division by zero
