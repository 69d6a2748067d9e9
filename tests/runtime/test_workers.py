"""seqmem.runtime.workers: a tf.distribute step's workers run one plan, and a failing worker fails the others.

The device-tier tests run two `MultiWorkerMirroredStrategy` workers on this machine (`models.zoo.workers`).
"""

import dataclasses

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem.analyze.analysis import analyze_graph
from seqmem.errors import WorkersDisagreeError
from seqmem.ir.graph import TensorRef
from seqmem.edge.collectives import collective_ops
from seqmem.runtime.workers import ABORT_MARK, Workers, _part_digests, failure_line, plan_digest, workers_of
from seqmem.decisions.plan import Decision, Plan
from tests.builders import training_graph


def _plan(*tensors: str, predicted: int = 10) -> Plan:
    decisions = tuple(Decision(TensorRef(name, 0), 1 << 20, ("grad",), "trigger", 1e-3) for name in tensors)
    return Plan(100, 90, 120, predicted, decisions=decisions, pinned_order=("a", "b"))


def _collective_graph() -> graph_pb2.GraphDef:
    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="x", op="Const")
    body = graph_def.library.function.add()
    body.signature.name = "replica_step"
    body.node_def.add(name="all_reduce", op="CollectiveReduceV2")
    return graph_def


def test_collectives_are_found_in_library_functions():
    assert collective_ops(_collective_graph()) == ["replica_step/all_reduce"]
    assert collective_ops(graph_pb2.GraphDef()) == []


def test_a_step_without_collectives_has_no_workers():
    assert workers_of(graph_pb2.GraphDef()) is None


def test_a_step_with_collectives_outside_a_strategy_scope_is_refused():
    with pytest.raises(ValueError, match="strategy.scope"):
        workers_of(_collective_graph())


def test_the_digest_covers_what_runs_not_what_was_predicted():
    assert plan_digest(_plan("a", "b")) == plan_digest(_plan("a", "b", predicted=11))
    assert plan_digest(_plan("a", "b")) != plan_digest(_plan("a", "c"))
    assert plan_digest(_plan("a")) != plan_digest(dataclasses.replace(_plan("a"), pinned_order=("b", "a")))


class _Gathered(Workers):
    """Workers whose gather returns fixed rows, as two workers' would."""

    def __init__(self, rows):
        super().__init__(strategy=None, count=len(rows))
        object.__setattr__(self, "rows", rows)

    def gathered(self, values):
        return self.rows


def test_workers_that_planned_differently_all_refuse_to_run_and_say_what_differs():
    same = list(_part_digests(_plan("a")).values())
    other_order = list(_part_digests(dataclasses.replace(_plan("a"), pinned_order=("b", "a"))).values())
    with pytest.raises(WorkersDisagreeError, match=r"planned differently \(their plans differ in: pinned order\)"):
        _Gathered([same, other_order]).check_same(_plan("a"))
    _Gathered([same, same]).check_same(_plan("a"))


class _Answers(Workers):
    """Workers whose gathers return the next of fixed answers (rows by worker), one answer per gather."""

    def __init__(self, *answers):
        super().__init__(strategy=None, count=len(answers[0]))
        object.__setattr__(self, "answers", list(answers))

    def gathered(self, values):
        rows = self.answers.pop(0)
        return [list(values) if row is None else row for row in rows]  # None: this worker's own values


def test_workers_plan_from_the_highest_scratch_and_bytes_in_use_any_of_them_measured():
    analysis = dataclasses.replace(analyze_graph(training_graph()), in_use_before_bytes={"": 7})
    nodes = sorted(analysis.graph.nodes)
    own = [7] + [analysis.scratch_bytes.get(name, 0) for name in nodes]
    other = [5] + [3 << 20 if name == nodes[1] else 0 for name in nodes]
    agreed = _Answers([None, None], [own, other]).agreed(analysis)
    assert agreed.in_use_before_bytes == {"": 7}
    assert agreed.scratch_bytes[nodes[1]] == max(3 << 20, analysis.scratch_bytes.get(nodes[1], 0))
    assert {name: size for name, size in agreed.scratch_bytes.items() if name != nodes[1]} == {
        name: size for name, size in analysis.scratch_bytes.items() if size and name != nodes[1]}


def test_workers_that_traced_different_graphs_refuse_to_plan():
    analysis = analyze_graph(training_graph())
    with pytest.raises(WorkersDisagreeError, match="traced different graphs"):
        _Answers([None, [12345]]).agreed(analysis)


def test_highest_takes_each_position_over_workers_and_none_from_any():
    assert _Gathered([[5, 1], [3, 2]]).highest([0, 0]) == [5, 2]
    assert _Gathered([[5, -1], [3, 2]]).highest([0, 0]) == [5, None]


def test_one_worker_gathers_its_own_values_and_agrees_with_itself():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        workers = Workers(strategy, strategy.num_replicas_in_sync)
        assert workers.highest([7, None]) == [7, None]
        workers.check_same(_plan("a"))
        analysis = analyze_graph(training_graph())
        assert workers.agreed(analysis).scratch_bytes == {
            name: size for name, size in analysis.scratch_bytes.items() if size}


def test_the_failure_line_names_the_abort_or_the_allocation():
    assert failure_line("Graph execution error:\n\nOOM when allocating tensor with shape[4]\n[[node]]") \
        == "OOM when allocating tensor with shape[4]"
    assert failure_line("Graph execution error:\nOOM when allocating tensor with shape[4] on CPU:0\n"
                        "\t [[{{node gradient_tape/conv/Conv2DBackpropFilter}}]]\nHint: ...") \
        == "OOM when allocating tensor with shape[4] on CPU:0 in node gradient_tape/conv/Conv2DBackpropFilter"
    assert ABORT_MARK in failure_line(f"Graph execution error:\nCollective ops is aborted by: {ABORT_MARK}: x")
    assert failure_line("Graph execution error:\nsomething else") == "something else"


@pytest.mark.device
def test_two_workers_run_one_plan_bit_for_bit_and_one_out_of_memory_fails_both():
    from models.zoo.workers import run_workers

    original = run_workers("small_cnn", 64, 1024, None, 2)
    budget_mb = int(0.7 * max(result["peak_bytes"] for result in original) / (1 << 20))
    # after training, worker 0 fills its device and calls once more: it runs out of memory
    optimized = run_workers("small_cnn", 64, 1024, budget_mb, 2, hold_mb=(980, 0), timeout_s=300)
    assert all("losses" in result for result in original + optimized), original + optimized
    assert optimized[0]["decisions"] > 0
    assert optimized[0]["plan_digest"] == optimized[1]["plan_digest"]
    for before, after in zip(original, optimized):
        assert after["peak_bytes"] <= budget_mb << 20
        assert (after["losses"], after["digest"]) == (before["losses"], before["digest"])
    failed, other = (result["after_hold"] for result in optimized)
    assert failed["error"] == "ResourceExhaustedError", failed
    # the other worker's all-reduce fails with the first one's message instead of waiting for it
    assert other["error"] == "UnavailableError" and ABORT_MARK in other["message"], other


@pytest.mark.device
def test_keras_fit_within_budget_on_two_workers_trains_as_plain_fit():
    from models.zoo.workers import run_workers

    plain = run_workers("small_cnn", 64, 1024, None, 2, keras_fit=True)
    budget_mb = int(0.7 * max(result["peak_bytes"] for result in plain) / (1 << 20))
    fitted = run_workers("small_cnn", 64, 1024, budget_mb, 2, keras_fit=True)
    assert all("losses" in result for result in plain + fitted), plain + fitted
    for before, after in zip(plain, fitted):
        assert after["peak_bytes"] <= budget_mb << 20
        assert (after["losses"], after["digest"]) == (before["losses"], before["digest"])


class _Step:
    """A step of two workers whose calls report `peak` bytes (None: out of memory), and its local twin."""

    def __init__(self, workers, peak, local_peak, can_be_local=True):
        self.workers, self.peak, self.calls = workers, peak, []
        self.local = _Step(None, local_peak, None, can_be_local=False) if can_be_local else None

    def without_collectives(self):
        return self.local


def _measured(monkeypatch, step, budget_bytes=100):
    from seqmem.runtime import optimize as optimize_module

    def step_peaks(run, args, variables, calls):
        run.calls.append(calls)
        if run.peak is None:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
        return [run.peak]

    monkeypatch.setattr(optimize_module, "step_peaks", step_peaks)
    monkeypatch.setattr(optimize_module, "captured_variables", lambda function: ())
    return optimize_module._measured_peak(step, None, (), budget_bytes)


def test_a_worker_out_of_memory_with_local_all_reduces_makes_every_worker_plan_again(monkeypatch):
    step = _Step(_Gathered([[-1], [50]]), peak=60, local_peak=None)
    assert _measured(monkeypatch, step) is None  # the other worker's 50 fitted: every worker plans again
    assert step.local.calls and not step.calls  # the step with collectives never ran, none was aborted


def test_a_plan_every_worker_fits_locally_is_measured_with_its_collectives(monkeypatch):
    step = _Step(_Gathered([[90], [95]]), peak=90, local_peak=90)
    assert _measured(monkeypatch, step) == 95
    assert step.local.calls and step.calls
    over = _Step(_Gathered([[120], [95]]), peak=90, local_peak=90)
    assert _measured(monkeypatch, over) == 120 and not over.calls  # over the budget locally: plan again
    unmade = _Step(_Gathered([[70], [80]]), peak=70, local_peak=None, can_be_local=False)
    assert _measured(monkeypatch, unmade) == 80 and unmade.calls  # no local twin: measured as it is
