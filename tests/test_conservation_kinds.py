"""The selector's conservation kinds (swap, recompute, compress, compress+swap) on hand-built steps."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqmem.analyze.analysis import analyze_graph
from seqmem.plan import choose_conservations, simulate_baseline
from seqmem.plan.candidates import Option, conservation_candidates
from seqmem.plan.host_room import HostRoom
from seqmem.plan.search import cheapest_helpful
from seqmem.analyze.critical_path import MachineModel
from seqmem.errors import InfeasibleBudgetError
from seqmem.ir.graph import TensorInfo, TensorRef
from seqmem.decisions.kinds import Recompute, kind_named
from seqmem.decisions.plan import KINDS, ConservationOptions, Decision, Plan
from seqmem.rewrite.conservations import rewrite
from tests.builders import IdentityBackend, graph, node, tensor

MB = 1 << 20
LOSSLESS = ConservationOptions(kinds=("swap", "recompute"))
EVERY_KIND = ConservationOptions(kinds=KINDS, compression="float16")


def _fitting(*arguments, **options) -> Plan:
    """The plan `choose_conservations` finds; InfeasibleBudgetError where none fits."""
    return choose_conservations(*arguments, **options).fitting_plan()


def relu_net(layers=4, size=MB, dtype="float32"):
    """x -> m_i = MatMul(r_{i-1}) -> r_i = Relu(m_i) -> ... -> loss. Backward: the Relu gradient reads r_i,
    the MatMul gradient reads r_{i-1}, and the last reader of m_i (as batch norm's gradient reads its
    input) comes after both: r_i can be recomputed from m_i, which the device keeps anyway."""
    info = tensor(size, dtype=dtype)
    nodes = [node("x", "Placeholder", outputs=(1024,)), node("w", "Const", outputs=(1024,))]
    previous = "x"
    for i in range(1, layers + 1):
        nodes += [node(f"m{i}", "MatMul", [previous, "w"], outputs=(info,)), node(f"r{i}", "Relu", [f"m{i}"],
                                                                                   outputs=(info,))]
        previous = f"r{i}"
    nodes += [node("loss", "Sum", [previous], outputs=(TensorInfo("float32", (), 4),)), node("ones", "Const")]
    gradient = "ones"
    for i in range(layers, 0, -1):
        nodes.append(node(f"gradient_tape/relu{i}", "Op", [gradient, f"r{i}"], outputs=(info,)))
        below = f"r{i - 1}" if i > 1 else "x"
        nodes.append(node(f"gradient_tape/matmul{i}", "Op", [f"gradient_tape/relu{i}", below], outputs=(info,)))
        nodes.append(node(f"gradient_tape/norm{i}", "Op", [f"gradient_tape/matmul{i}", f"m{i}"], outputs=(info,)))
        gradient = f"gradient_tape/norm{i}"
    return graph(*nodes)


def _plan(g, fraction, options, **kwargs):
    analysis = analyze_graph(g, **kwargs)
    peak = simulate_baseline(analysis, allocator="exact").trace.peak_bytes
    return analysis, _fitting(analysis, int(peak * fraction), allocator="exact", options=options)


def test_recompute_reruns_a_cheap_op_from_a_tensor_the_device_keeps_anyway():
    g = relu_net()
    _, plan = _plan(g, 0.8, ConservationOptions(kinds=("recompute",)))
    assert plan.feasible and plan.decisions
    recomputed = {d.tensor.node: d for d in plan.decisions}
    assert set(recomputed) <= {"r1", "r2", "r3", "r4"} and all(d.kind.name == "recompute" for d in plan.decisions)
    decision = next(iter(plan.decisions))
    assert decision.kind.nodes == (decision.tensor.node,) and decision.precision == "exact"
    assert decision.saved_bytes == MB and decision.cost_s > 0 and decision.transfer_s == 0
    new = rewrite(g, plan, IdentityBackend())
    new.validate()
    copy = new.node(next(r.node for r in new.node(decision.consumers[0]).inputs if "seqmem_swap" in r.node))
    assert copy.op == "Relu" and copy.inputs == (TensorRef(f"m{decision.tensor.node[1:]}"),)
    assert decision.trigger in copy.control_inputs
    assert "recompute" in plan.summary() and Plan.from_json(plan.to_json()) == plan


def test_lossless_kinds_swap_what_hides_its_transfer_and_recompute_what_cannot():
    g = relu_net(layers=6)
    hidden = _plan(g, 0.6, LOSSLESS)[1]
    assert {d.kind.name for d in hidden.decisions} == {"swap"}  # free: the transfers hide behind computation
    slow_host = MachineModel(host_bytes_per_s=1e6)
    analysis = analyze_graph(g, machine=slow_host)
    budget = int(0.8 * hidden.predicted_peak_before_bytes)
    plan = _fitting(analysis, budget, allocator="exact", machine=slow_host, options=LOSSLESS)
    assert {d.kind.name for d in plan.decisions} == {"recompute"}
    with pytest.raises(InfeasibleBudgetError):
        _fitting(analysis, budget, allocator="exact", machine=slow_host, options=ConservationOptions(kinds=("swap",)))


def test_where_copies_take_the_computes_own_time_swaps_cost_their_transfer_and_restore_just_in_time():
    g = relu_net(layers=6)
    analysis = analyze_graph(g)
    budget = int(0.7 * simulate_baseline(analysis, allocator="exact").trace.peak_bytes)
    overlapping = _fitting(analysis, budget, allocator="exact", options=EVERY_KIND)
    serial_machine = MachineModel(host_bytes_per_s=1e9, copies_overlap=False)
    serial = _fitting(analysis, budget, allocator="exact", machine=serial_machine, options=EVERY_KIND)
    assert overlapping.feasible and serial.feasible
    assert {d.kind.name for d in overlapping.decisions} == {"swap"}  # hidden behind computation: free
    assert "swap" not in {d.kind.name for d in serial.decisions}  # costs its whole transfer: compressing is cheaper
    swapped = _fitting(analysis, budget, allocator="exact", machine=serial_machine, options=LOSSLESS)
    swaps = [d for d in swapped.decisions if d.kind.name == "swap"]
    assert swaps and all(d.cost_s == pytest.approx(2 * d.transfer_s) for d in swaps)
    # just in time: the swap-in starts after the last backward node that completes before its first reader
    timing, order = analysis.timing, analysis.order
    for decision in swaps:
        first = min(decision.consumers, key=order.index)
        later = [n for n in order[order.index(decision.trigger) + 1:order.index(first)]
                 if n.startswith("gradient_tape/")]
        assert all(timing.completion_s[n] > timing.start_s[first] for n in later), decision


def test_compress_keeps_half_on_the_device_and_casts_after_the_forward_readers():
    g = relu_net()
    analysis, compressed = _plan(g, 0.85, ConservationOptions(kinds=("compress",), compression="fp16"))
    assert compressed.decisions and all(d.kind.name == "compress" and d.precision == "float16" for d in compressed.decisions)
    assert all(d.saved_bytes == MB // 2 and d.resident_bytes == MB // 2 for d in compressed.decisions)
    swapped = _fitting(analysis, compressed.budget_bytes, allocator="exact",
                         options=ConservationOptions(kinds=("swap",), max_decisions=len(compressed.decisions)))
    assert swapped.predicted_peak_after_bytes < compressed.predicted_peak_after_bytes  # half of each stays
    new = rewrite(g, compressed, IdentityBackend())
    new.validate()
    decision = compressed.decisions[0]
    back = new.node(next(r.node for r in new.node(decision.consumers[0]).inputs if "seqmem_swap" in r.node))
    down = new.node(back.inputs[0].node)
    assert back.op == down.op == "Cast" and back.control_inputs == (decision.trigger,)
    assert down.outputs[0].dtype == "float16" and down.outputs[0].size_bytes == MB // 2
    forward_readers = {r for r in g.consumers(decision.tensor) if r not in decision.consumers}
    assert set(down.control_inputs) == forward_readers


def test_compress_and_swap_moves_half_the_bytes():
    g = relu_net()
    _, plan = _plan(g, 0.7, ConservationOptions(kinds=("compress+swap",), compression="bfloat16"))
    decision = plan.decisions[0]
    assert decision.kind.name == "compress+swap" and decision.saved_bytes == MB
    assert decision.transfer_s == pytest.approx(MachineModel().host_bytes_per_s ** -1 * MB / 2)
    new = rewrite(g, plan, IdentityBackend())
    new.validate()
    ops = []
    current = next(r for r in new.node(decision.consumers[0]).inputs if "seqmem_swap" in r.node)
    while "seqmem_swap" in current.node:
        ops.append(new.node(current.node).op)
        current = new.node(current.node).inputs[0]
    assert ops == ["Cast", "DeviceCopy", "HostCopy", "Cast"] and current == decision.tensor


def test_only_float32_tensors_are_compressed():
    g = relu_net(dtype="int32")
    with pytest.raises(InfeasibleBudgetError):
        _plan(g, 0.8, ConservationOptions(kinds=("compress",), compression="float16"))
    analysis = analyze_graph(g)
    plan = _fitting(analysis, 1 << 40, allocator="exact")
    assert not plan.decisions
    trace = simulate_baseline(analysis, allocator="exact").trace
    position = {name: i for i, name in enumerate(analysis.order)}
    _, skipped = conservation_candidates(analysis, trace, MachineModel(), ConservationOptions(kinds=("compress",),
                                                                                  compression="float16"), position, set())
    assert skipped and all("only float32 tensors are compressed" in s.reason for s in skipped if s.size_bytes >= MB)


def test_options_limit_sizes_lifetimes_and_insertions():
    g = relu_net(layers=6)
    _, plan = _plan(g, 0.5, ConservationOptions(kinds=("swap",)))
    assert len(plan.decisions) > 1
    with pytest.raises(InfeasibleBudgetError):
        _plan(g, 0.5, ConservationOptions(kinds=("swap",), max_decisions=1))
    _, one = _plan(g, 0.95, ConservationOptions(kinds=("swap",), max_decisions=1))
    assert len(one.decisions) == 1 and "at most 1 of them" in one.summary()
    _, none = _plan(g, 1.0, ConservationOptions(kinds=("swap",), min_slack_s=1e6))
    assert not none.decisions
    analysis = analyze_graph(g)
    trace = simulate_baseline(analysis, allocator="exact").trace
    position = {name: i for i, name in enumerate(analysis.order)}
    candidates, skipped = conservation_candidates(analysis, trace, MachineModel(), ConservationOptions(min_slack_s=1e6), position,
                                      set())
    assert not candidates and all("under min_slack_s" in s.reason for s in skipped if s.size_bytes >= MB)
    assert Plan.from_json(one.to_json()) == one


def test_swaps_hold_no_more_host_memory_than_allowed():
    g = relu_net(layers=6)
    _, free = _plan(g, 0.5, ConservationOptions(kinds=("swap",)))
    assert free.host_bytes == sum(d.size_bytes for d in free.decisions) > 0
    limit = free.host_bytes - 1
    with pytest.raises(InfeasibleBudgetError, match=f"swaps limited to {limit / MB:.1f} MB of host memory"):
        _plan(g, 0.5, ConservationOptions(kinds=("swap",), max_host_bytes=limit))
    _, halved = _plan(g, 0.5, ConservationOptions(kinds=("compress+swap",), compression="float16",
                                                  max_host_bytes=limit))
    assert 0 < halved.host_bytes <= limit and halved.host_bytes == sum(d.compressed_bytes for d in halved.decisions)
    assert "host memory" in halved.summary() and Plan.from_json(halved.to_json()) == halved


def _smallest_peak(g, options):
    """The lowest peak any plan with `options` reaches (exact allocator), bytes."""
    analysis = analyze_graph(g)
    result = choose_conservations(analysis, int(0.01 * simulate_baseline(analysis, allocator="exact").trace.peak_bytes),
                                  allocator="exact", options=options)
    assert not result.fits
    return result.smallest_peak_bytes


def test_where_host_memory_bounds_the_swaps_each_further_kind_lowers_the_peak():
    # swaps alone stop at the host's room; recomputation frees on the device what they cannot, and
    # compression halves the device copy and the host copy, so (host limited) swap > lossless > every kind
    g = relu_net(layers=8)
    limit = 3 * MB
    swap_only = _smallest_peak(g, ConservationOptions(kinds=("swap",), max_host_bytes=limit))
    lossless = _smallest_peak(g, ConservationOptions(kinds=("swap", "recompute"), max_host_bytes=limit))
    every = _smallest_peak(g, ConservationOptions(kinds=KINDS, compression="float16", max_host_bytes=limit))
    assert swap_only > lossless > every
    assert _smallest_peak(g, ConservationOptions(kinds=("swap",))) <= every  # without the limit swaps free most


@pytest.mark.parametrize("options, message", [
    (dict(kinds=("swap", "fold")), "kinds must be a non-empty selection"),
    (dict(kinds=()), "kinds must be a non-empty selection"),
    (dict(kinds=("compress",)), "say which dtype to compress to"),
    (dict(kinds=("swap",), compression="float16"), "needs a compressed kind"),
    (dict(kinds=("compress",), compression="int8"), "compression must be one of"),
    (dict(max_decisions=-1), "max_decisions"),
    (dict(min_slack_s=-1.0), "min_slack_s"),
    (dict(max_host_bytes=-1), "max_host_bytes"),
])
def test_bad_options_are_clear_value_errors(options, message):
    with pytest.raises(ValueError, match=message):
        ConservationOptions(**options)


def test_kinds_are_kept_in_their_canonical_order_and_names():
    options = ConservationOptions(kinds=["compress+swap", "swap"], compression="bf16")
    assert options.kinds == ("swap", "compress+swap") and options.compression == "bfloat16"
    assert ConservationOptions(kinds="recompute").kinds == ("recompute",)


def test_the_blocked_head_is_a_kind_of_the_step_not_of_a_tensor():
    options = ConservationOptions(kinds=("blocked-head", "swap"))
    assert options.kinds == ("swap", "blocked-head") and options.tensor_kinds == ("swap",) and options.blocked_head
    alone = ConservationOptions(kinds=("blocked-head",))
    assert alone.tensor_kinds == () and alone.blocked_head
    assert not ConservationOptions().blocked_head


@st.composite
def options_of_one_candidate(draw):
    count = draw(st.integers(1, 4))
    options = []
    for kind in draw(st.permutations(KINDS))[:count]:
        size = 4 * MB
        decision = Decision(TensorRef("t"), size, ("b",), "trigger", 0.0, kind=kind_named(kind, "float16"),
                            cost_s=draw(st.floats(0, 1e-2)))
        options.append(Option(decision, in_pos=draw(st.integers(1, 20)), restore_bytes=0))
    return options, draw(st.integers(0, 19)), draw(st.integers(0, 5 * MB))


@settings(max_examples=200, deadline=None)
@given(options_of_one_candidate())
def test_the_chosen_kind_is_never_worse_in_both_peak_and_time_than_one_considered(case):
    from seqmem.plan.candidates import Candidate

    options, peak, needed = case
    chosen = cheapest_helpful(Candidate(TensorRef("t"), 0, tuple(options)), peak, needed, {}, HostRoom(math.inf))
    helpful = [o for o in options if peak < o.in_pos]
    if not helpful:
        assert chosen is None
        return
    assert chosen in helpful
    for other in helpful:
        saves, costs = other.decision.saved_bytes, other.decision.cost_s
        assert not (saves >= chosen.decision.saved_bytes and costs <= chosen.decision.cost_s
                    and (saves, costs) != (chosen.decision.saved_bytes, chosen.decision.cost_s)), (chosen, other)
    if any(o.decision.saved_bytes >= needed for o in helpful):  # enough is enough: the cheapest that is
        assert chosen.decision.saved_bytes >= needed


@st.composite
def random_relu_steps(draw):
    g = relu_net(layers=draw(st.integers(2, 6)), size=draw(st.sampled_from([MB, 2 * MB])))
    costs = {name: draw(st.floats(1e-5, 1e-2)) for name in g.nodes}
    return g, costs, draw(st.floats(0.4, 1.0)), MachineModel(host_bytes_per_s=draw(st.sampled_from([1e6, 3e8, 6e9])))


@settings(max_examples=40, deadline=None)
@given(random_relu_steps())
def test_random_plans_with_every_kind_fit_stay_acyclic_and_are_deterministic(case):
    g, costs, fraction, machine = case
    analysis = analyze_graph(g, op_time_s=costs, machine=machine)
    peak = simulate_baseline(analysis, allocator="exact").trace.peak_bytes
    arguments = dict(budget_bytes=int(peak * fraction), allocator="exact", machine=machine, options=EVERY_KIND)
    result = choose_conservations(analysis, **arguments)
    if not result.fits:
        assert int(peak * fraction) < result.smallest_peak_bytes <= peak
        return
    plan = result.plan
    assert plan == _fitting(analysis, **arguments)
    assert plan.predicted_peak_after_bytes <= plan.budget_bytes
    assert plan.predicted_overhead_s == pytest.approx(sum(d.cost_s for d in plan.decisions))
    rewrite(g, plan, IdentityBackend()).validate()
    conserved = {d.tensor for d in plan.decisions}
    for decision in (d for d in plan.decisions if isinstance(d.kind, Recompute)):  # what it reads stays on the device
        read = {r for name in decision.kind.nodes for r in g.node(name).inputs if r.node not in decision.kind.nodes}
        assert not read & conserved
