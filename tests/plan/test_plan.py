import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqmem.analyze.analysis import analyze_graph
from seqmem.plan import choose_conservations, refined_pinned_order
from seqmem.analyze.critical_path import EMULATED_DEVICE, MachineModel
from seqmem.errors import InfeasibleBudgetError
from seqmem.ir.graph import TensorInfo, TensorRef
from seqmem.decisions.plan import ConservationOptions, Plan
from seqmem.rewrite.conservations import rewrite
from tests.builders import IdentityBackend, graph, loop_lists_training_graph, loop_training_graph, node

MB = 1 << 20


def mlp_like(layers=4, size=MB):
    """x -> f1..fn -> loss; gradient_tape/g_n..g_1 each read their f_i and the next gradient."""
    nodes = [node("x", "Placeholder", outputs=(1024,))]
    previous = "x"
    for i in range(1, layers + 1):
        nodes.append(node(f"f{i}", "Op", [previous], outputs=(size,)))
        previous = f"f{i}"
    nodes.append(node("loss", "Sum", [previous], outputs=(TensorInfo("float32", (), 4),)))
    nodes.append(node("ones", "Const", outputs=(4,)))
    gradient = "ones"
    for i in range(layers, 0, -1):
        nodes.append(node(f"gradient_tape/g{i}", "Op", [gradient, f"f{i}"], outputs=(size,)))
        gradient = f"gradient_tape/g{i}"
    return graph(*nodes)


def _fitting(*arguments, **options) -> Plan:
    """The plan `choose_conservations` finds; InfeasibleBudgetError where none fits."""
    return choose_conservations(*arguments, **options).fitting_plan()


def _analysis(g):
    return analyze_graph(g)


def test_already_fitting_step_is_left_alone():
    g = mlp_like()
    plan = _fitting(_analysis(g), budget_bytes=100 * MB, allocator="exact")
    assert not plan.decisions and plan.feasible and "already fits" in plan.notes[0]
    assert rewrite(g, plan, IdentityBackend()) is g


def test_swaps_longest_lived_first_and_fits_budget():
    g = mlp_like(layers=6)
    analysis = _analysis(g)
    before = _fitting(analysis, budget_bytes=100 * MB, allocator="exact")
    plan = _fitting(analysis, budget_bytes=before.predicted_peak_before_bytes - 2 * MB,
                      allocator="exact")
    assert plan.feasible and plan.predicted_peak_after_bytes <= plan.budget_bytes
    assert plan.decisions[0].tensor == TensorRef("f1")     # farthest from the loss
    for decision in plan.decisions:
        assert decision.consumers == (f"gradient_tape/g{decision.tensor.node[1:]}",)


def test_rewrite_reroutes_backward_readers_only_and_stays_acyclic():
    g = mlp_like(layers=6)
    analysis = _analysis(g)
    plan = _fitting(analysis, budget_bytes=5 * MB, allocator="exact")
    new = rewrite(g, plan, IdentityBackend())
    new.validate()
    for decision in plan.decisions:
        ref = decision.tensor
        forward_readers = [r for r in new.consumers(ref) if r.startswith("f") or r == "loss"]
        assert forward_readers, "forward readers keep the original"
        swap_in = new.node(new.node(decision.consumers[0]).inputs[1].node)
        assert swap_in.op == "DeviceCopy" and swap_in.control_inputs == (decision.trigger,)
        assert decision.consumers[0] not in new.ancestors([decision.trigger])


def _gradients_joined(layers=4, size=MB):
    """mlp_like, with each layer's weight gradient dw_i (read by nothing but one `join` of them all at the
    end of backward: a data-parallel step's all-reduce pack, a global-norm clip) and the update it feeds."""
    nodes = [node("x", "Placeholder", outputs=(1024,))]
    previous = "x"
    for i in range(1, layers + 1):
        nodes.append(node(f"f{i}", "Op", [previous], outputs=(size,)))
        previous = f"f{i}"
    nodes += [node("loss", "Sum", [previous], outputs=(TensorInfo("float32", (), 4),)), node("ones", "Const", outputs=(4,))]
    gradient = "ones"
    for i in range(layers, 0, -1):
        nodes.append(node(f"gradient_tape/dw{i}", "Op", [gradient, f"f{i}"], outputs=(size,)))
        nodes.append(node(f"gradient_tape/g{i}", "Op", [gradient, f"f{i}"], outputs=(size,)))
        gradient = f"gradient_tape/g{i}"
    joined = [f"gradient_tape/dw{i}" for i in range(layers, 0, -1)]
    nodes.append(node("join", "Op", [*joined, gradient], outputs=(4,)))
    return graph(*nodes, outputs=("join",))


def test_gradients_waiting_for_a_join_are_swapped_until_it_runs():
    # as it is, 9 MB when g1 runs: six weight gradients waiting, g2, g1 and f1; the join's own inputs are 7 MB
    g = _gradients_joined(layers=6)
    analysis = _analysis(g)
    result = choose_conservations(analysis, budget_bytes=1, allocator="exact")
    assert not result.fits and result.reason.startswith("smallest achievable peak is 7.0 MB (Op 'join';")
    assert result.floor.op == "join" and result.floor.working_bytes == 7 * MB + 4 and not result.floor.held  # and its output
    plan = result.plan
    held = [d for d in plan.decisions if d.tensor.node.startswith("gradient_tape/dw")]
    assert held and all(d.consumers == ("join",) for d in held)
    # the feature maps are tried first
    fitting = _fitting(analysis, budget_bytes=8 * MB + 1024, allocator="exact")
    assert fitting.feasible and fitting.decisions[0].tensor == TensorRef("f1")
    rewritten = rewrite(g, plan, IdentityBackend())
    rewritten.topological_order()  # acyclic
    assert any("seqmem_swap" in ref.node for ref in rewritten.node("join").inputs)


def test_a_floor_counts_a_restored_input_as_the_ops_own():
    """A feature map computed in place (a Relu over its BiasAdd's buffer) is swapped where the peak was
    (g3's large output) and restored for g1, where the lowest peak is: the restored copy is g1's input, part
    of its working set, not a buffer held beside it."""
    nodes = [node("x", "Placeholder", outputs=(1024,))]
    for i in range(1, 5):
        nodes += [node(f"b{i}", "BiasAdd", ["x" if i == 1 else f"f{i - 1}"], outputs=(MB,)),
                  node(f"f{i}", "Relu", [f"b{i}"], outputs=(MB,))]
    nodes += [node("loss", "Sum", ["f4"], outputs=(TensorInfo("float32", (), 4),)), node("ones", "Const")]
    for i, size in ((4, 2), (3, 12), (2, 2), (1, 13)):
        nodes.append(node(f"gradient_tape/g{i}", "Op", ["ones" if i == 4 else f"gradient_tape/g{i + 1}", f"f{i}"],
                          outputs=(size * MB,)))
    result = choose_conservations(_analysis(graph(*nodes)), budget_bytes=1, allocator="exact")
    assert TensorRef("f1") in {d.tensor for d in result.plan.decisions}
    floor = result.floor
    assert floor.op == "gradient_tape/g1" and not floor.held
    assert floor.working_bytes == (2 + 1 + 13) * MB


def _gradients_applied_by(op):
    """A step whose update is one node of `op` taking every gradient (and returning nothing), as a
    loss-scale optimizer's `If`, with handles captured for its body (allocating nothing) scheduled before it."""
    return graph(node("x", "Placeholder", outputs=(1024,)), node("f1", "Op", ["x"], outputs=(MB,)),
                 node("f2", "Op", ["f1"], outputs=(MB,)),
                 node("loss", "Sum", ["f2"], outputs=(TensorInfo("float32", (), 4),)), node("ones", "Const"),
                 node("gradient_tape/dw2", "Op", ["ones", "f2"], outputs=(4 * MB,)),
                 node("gradient_tape/g2", "Op", ["ones", "f2"], outputs=(MB,)),
                 node("gradient_tape/dw1", "Op", ["gradient_tape/g2", "f1"], outputs=(4 * MB,)),
                 node("scaled", "Op", ["gradient_tape/dw1"], outputs=(4 * MB,)),
                 node("update/input_3", "Op", control=("scaled",), outputs=(0,)),
                 node("update", op, ["gradient_tape/dw2", "gradient_tape/dw1", "scaled", "update/input_3"],
                      outputs=()))


def test_a_floor_held_for_a_function_call_says_so():
    """The peak lasts from the last gradient's op until the call, and a gradient held across it is named as
    the call's input."""
    options = ConservationOptions(min_bytes=64 * MB)
    result = choose_conservations(_analysis(_gradients_applied_by("StatefulPartitionedCall")), budget_bytes=1,
                                  allocator="exact", options=options)
    floor = result.floor
    assert (floor.op, floor.until, floor.until_type) == ("scaled", "update", "StatefulPartitionedCall")
    assert [b.tensor.node for b in floor.held] == ["gradient_tape/dw2"]
    assert floor.held[0].why == ("an input of StatefulPartitionedCall 'update', a function call: it takes every "
                                 "input on the device at once, and seqmem plans nothing inside function bodies")
    assert "the peak lasts until StatefulPartitionedCall 'update'" in result.reason


def test_gradients_a_conditional_applies_are_restored_in_its_branches_one_at_a_time():
    """Swapped for an `If`, the gradients come back in its branches: it holds the largest, not all three."""
    analysis = _analysis(_gradients_applied_by("If"))
    result = choose_conservations(analysis, budget_bytes=1, allocator="exact")
    in_branch = {d.tensor.node for d in result.plan.decisions if d.in_branch}
    assert in_branch == {"gradient_tape/dw2", "gradient_tape/dw1"}  # scaled: the If reads it right away
    assert all(d.consumers == ("update",) for d in result.plan.decisions if d.in_branch)
    as_inputs = choose_conservations(analysis, budget_bytes=1, allocator="exact",
                                     options=ConservationOptions(min_bytes=64 * MB))
    assert result.smallest_peak_bytes <= as_inputs.smallest_peak_bytes - 4 * MB
    rewritten = rewrite(analysis.graph, result.plan, IdentityBackend())
    restores = [name for name, n in rewritten.nodes.items() if n.attrs.get("in_branch")]
    assert len(restores) == 2 and set(rewritten.consumers(TensorRef(restores[0]))) == {"update"}


def test_infeasible_budget_names_the_minimum_and_the_op_and_holds_the_plan_that_reaches_it():
    g = mlp_like()
    expected = (r"smallest achievable peak is [\d.]+ MB \(Op '.*'; of it [\d.]+ MB live through the step .*, "
                r"[\d.]+ MB the op's own inputs, outputs and scratch, [\d.]+ MB held by \d+ other buffers.*\); "
                r"budget was 0.5 MB")
    result = choose_conservations(_analysis(g), budget_bytes=MB // 2, allocator="exact", pinned=True)
    assert not result.fits and not result.fragmented
    lowest = result.plan
    assert lowest.decisions and lowest.pinned_order
    assert lowest.predicted_peak_after_bytes == lowest.target_bytes == result.smallest_peak_bytes
    with pytest.raises(InfeasibleBudgetError, match=expected) as error:  # at the boundary
        result.fitting_plan()
    assert error.value.smallest_peak_bytes == result.smallest_peak_bytes and error.value.floor == result.floor
    rewrite(g, lowest, IdentityBackend()).validate()


def test_a_floor_splits_into_what_lives_through_the_step_the_ops_working_set_and_what_is_held_and_why():
    g = mlp_like(layers=4)
    options = ConservationOptions(min_bytes=2 * MB)  # no feature map is worth conserving
    floor = choose_conservations(_analysis(g), budget_bytes=1, allocator="exact", options=options).floor
    peak_op = g.node(floor.op)
    assert peak_op.op == "Op" and floor.persistent_bytes == 1024 + 4  # the input and the gradient seed
    own = {ref.node for ref in peak_op.inputs} | {floor.op}
    assert floor.working_bytes == sum(g.node(name).outputs[0].size_bytes for name in own if name != "ones")
    assert floor.held and all(b.tensor.node not in own for b in floor.held)
    assert all(b.why == f"not conserved: smaller than {2 * MB} bytes" for b in floor.held)
    assert floor.peak_bytes == floor.persistent_bytes + floor.working_bytes + floor.held_bytes


def test_swaps_on_the_emulated_device_keep_their_handles_on_it():
    g = mlp_like(layers=6)
    analysis = _analysis(g)
    budget = _fitting(analysis, budget_bytes=100 * MB, allocator="exact").predicted_peak_before_bytes - 2 * MB
    on_gpu = _fitting(analysis, budget_bytes=budget, allocator="exact")
    emulated = _fitting(analysis, budget_bytes=budget, allocator="exact", machine=EMULATED_DEVICE)
    assert {d.handle_bytes for d in on_gpu.decisions} == {0}
    assert {d.handle_bytes for d in emulated.decisions} == {EMULATED_DEVICE.host_handle_bytes} != {0}
    assert Plan.from_json(emulated.to_json()) == emulated


def test_plan_json_round_trip():
    g = mlp_like(layers=6)
    plan = _fitting(_analysis(g), budget_bytes=5 * MB, allocator="exact", pinned=True)
    assert plan.pinned_order and Plan.from_json(plan.to_json()) == plan
    assert "tensors conserved" in plan.summary()


def test_a_pinned_plan_is_made_on_the_pinned_order_and_its_rewrite_stays_acyclic():
    g = mlp_like(layers=6)
    analysis = _analysis(g)
    plan = _fitting(analysis, budget_bytes=5 * MB, allocator="exact", pinned=True)
    assert plan.decisions and plan.pinned_order == analysis.pinned_order
    rewrite(g, plan, IdentityBackend()).validate()
    fits = _fitting(analysis, budget_bytes=100 * MB, allocator="exact", pinned=True)
    assert not fits.decisions and fits.pinned_order and "fits once pinned" in fits.notes[0]


def test_a_step_can_be_pinned_to_its_own_order():
    analysis = _analysis(mlp_like(layers=6))
    own = analysis.pinning_its_own_order()
    assert own.pinned_order == analysis.order and own.order == analysis.order
    plan = _fitting(own, budget_bytes=5 * MB, allocator="exact", pinned=True)
    assert plan.decisions and plan.pinned_order == analysis.order


@st.composite
def training_chains(draw):
    layers = draw(st.integers(2, 9))
    sizes = draw(st.lists(st.integers(1, 8), min_size=layers, max_size=layers))
    nodes = [node("x", "Placeholder", outputs=(1024,))]
    for i in range(1, layers + 1):
        skip = draw(st.integers(0, i - 1))
        inputs = [nodes[-1].name] + ([f"f{skip}"] if skip and draw(st.booleans()) else [])
        nodes.append(node(f"f{i}", "Op", inputs, outputs=(sizes[i - 1] * MB,)))
    nodes.append(node("loss", "Sum", [f"f{layers}"], outputs=(TensorInfo("float32", (), 4),)))
    nodes.append(node("ones", "Const", outputs=(4,)))
    gradient = "ones"
    for i in range(layers, 0, -1):
        nodes.append(node(f"gradient_tape/g{i}", "Op", [gradient, f"f{i}"], outputs=(sizes[i - 1] * MB,)))
        gradient = f"gradient_tape/g{i}"
    return graph(*nodes), draw(st.floats(0.3, 1.0))


@settings(max_examples=60, deadline=None)
@given(training_chains())
def test_random_plans_are_acyclic_deterministic_and_honest(case):
    g, fraction = case
    analysis = _analysis(g)
    peak = _fitting(analysis, budget_bytes=1 << 40, allocator="exact").predicted_peak_before_bytes
    budget = int(peak * fraction)
    result = choose_conservations(analysis, budget_bytes=budget, allocator="exact")
    if not result.fits:
        assert budget < result.smallest_peak_bytes <= peak  # the lowest peak tried: never above no swaps at all
        return
    plan = result.plan
    assert plan == _fitting(analysis, budget_bytes=budget, allocator="exact")
    assert plan.predicted_peak_after_bytes <= budget
    new = rewrite(g, plan, IdentityBackend())
    new.validate()
    for decision in plan.decisions:
        for consumer in decision.consumers:
            # the rerouted reader reads a copy of exactly the swapped tensor
            copy = new.node(next(r.node for r in new.node(consumer).inputs if "seqmem_swap" in r.node))
            assert new.node(copy.inputs[0].node).inputs[0] == decision.tensor


def _loop_analysis(**sizes):
    g, swap = loop_training_graph(**sizes)
    return analyze_graph(g, loop_swaps=[swap]), swap


def test_a_loop_that_saves_too_much_swaps_its_accumulator_element_by_element():
    analysis, swap = _loop_analysis(iterations=10, element_bytes=MB)
    plan = _fitting(analysis, budget_bytes=6 * MB, allocator="exact", loop_swap_depth=1)
    assert plan.predicted_peak_before_bytes > 10 * MB and plan.feasible
    assert plan.loop_swaps == (swap,) and plan.loop_parallel_iterations == 1
    assert plan.loop_swapped_bytes == 10 * MB and plan.predicted_overhead_s > 0
    assert TensorRef("fwd", 1) not in {d.tensor for d in plan.decisions}  # never swapped whole as well
    assert "1 loop accumulators of 1 loop(s) swapped element by element (10.0 MB; prefetch depth 1" in plan.summary()
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.host_bytes == 10 * MB
    with pytest.raises(InfeasibleBudgetError, match="swaps limited to 9.0 MB of host memory"):  # the list goes whole
        _fitting(analysis, budget_bytes=6 * MB, allocator="exact", loop_swap_depth=1,
                   options=ConservationOptions(max_host_bytes=9 * MB))


def test_loop_swaps_only_when_asked_for_and_needed():
    analysis, _ = _loop_analysis(iterations=10, element_bytes=MB)
    fits = _fitting(analysis, budget_bytes=100 * MB, allocator="exact", loop_swap_depth=1)
    assert not fits.loop_swaps and fits.loop_parallel_iterations is None
    with pytest.raises(InfeasibleBudgetError):  # the list can only go whole, and the gradient loop needs it whole
        _fitting(analysis, budget_bytes=6 * MB, allocator="exact")


def test_a_deeper_prefetch_keeps_more_elements_on_the_device():
    analysis, _ = _loop_analysis(iterations=10, element_bytes=MB)
    shallow = _fitting(analysis, budget_bytes=9 * MB, allocator="exact", loop_swap_depth=1)
    deep = _fitting(analysis, budget_bytes=9 * MB, allocator="exact", loop_swap_depth=4)
    assert deep.predicted_peak_after_bytes == shallow.predicted_peak_after_bytes + 3 * MB


def test_the_loop_that_makes_the_step_fit_swaps_the_fewest_bytes_that_fit_and_lists_of_one_buffer_together():
    # lists of 40, 20, 10 and 10 MB; the first and the last save the same buffer
    g, (first, second, third, last) = loop_lists_training_graph(10, (4 * MB, 2 * MB, MB, MB),
                                                                buffers=("h", None, None, "h"))
    analysis = analyze_graph(g, loop_swaps=[first, second, third, last])
    before = _fitting(analysis, budget_bytes=1000 * MB, allocator="exact", loop_swap_depth=1)
    assert before.predicted_peak_before_bytes > 80 * MB and not before.loop_swaps
    plans = {budget: _fitting(analysis, budget_bytes=budget * MB, allocator="exact", loop_swap_depth=1)
             for budget in (80, 70, 50, 20)}
    # smallest first: 10 MB, then 30 MB, where the largest group alone would swap 50 MB
    assert plans[80].loop_swaps == (third,) and plans[80].loop_swapped_bytes == 10 * MB
    assert plans[70].loop_swaps == (third, second) and plans[70].loop_swapped_bytes == 30 * MB
    # largest first: 50 MB, where smallest first would take every list (80 MB)
    assert plans[50].loop_swaps == (first, last) and plans[50].loop_swapped_bytes == 50 * MB
    assert plans[20].loop_swaps == (first, last, second, third)  # the whole loop
    for budget, plan in plans.items():
        assert plan.feasible and plan.predicted_peak_after_bytes <= budget * MB and not plan.decisions
    assert plans[70].predicted_overhead_s < plans[50].predicted_overhead_s


def test_a_list_of_another_lists_buffers_goes_with_it_and_a_list_of_none_of_its_own_stays():
    # lists of 40 and 20 MB; a third pushes the first one's buffers (capture sizes it 0 bytes: counted in the
    # first), a fourth holds none of its own (another list's elements): swapping either alone frees nothing
    g, (first, second, sharer, other) = loop_lists_training_graph(10, (4 * MB, 2 * MB, 4 * MB, MB),
                                                                  buffers=("h", None, "h", "x"))
    loop = g.node("fwd")
    unsized = tuple(dataclasses.replace(info, size_bytes=0) if i in (3, 4) else info
                    for i, info in enumerate(loop.outputs))
    g = g.replace(nodes=[dataclasses.replace(node, outputs=unsized) if node is loop else node
                         for node in g.nodes.values()])
    analysis = analyze_graph(g, loop_swaps=[first, second, sharer, other])
    plans = {budget: _fitting(analysis, budget_bytes=budget * MB, allocator="exact", loop_swap_depth=1)
             for budget in (50, 40, 30)}
    assert plans[50].loop_swaps == (second,)
    assert plans[40].loop_swaps == (first, sharer)
    assert plans[40].loop_swapped_bytes == 80 * MB  # the sharer serializes its elements too: a second host copy
    assert plans[30].loop_swaps == (first, sharer, second)
    assert all(plan.feasible for plan in plans.values())


def _chain(sizes_mb):
    """x -> f1 -> ... -> loss, and a gradient chain whose op i reads f_i; f_i holds sizes_mb[i - 1] MB."""
    nodes = [node("x", "Placeholder", outputs=(1024,))]
    for i, size in enumerate(sizes_mb, start=1):
        nodes.append(node(f"f{i}", "Op", [nodes[-1].name], outputs=(int(size * MB),)))
    nodes += [node("loss", "Sum", [f"f{len(sizes_mb)}"], outputs=(TensorInfo("float32", (), 4),)),
              node("ones", "Const", outputs=(4,))]
    gradient = "ones"
    for i in range(len(sizes_mb), 0, -1):
        nodes.append(node(f"gradient_tape/g{i}", "Op", [gradient, f"f{i}"], outputs=(int(sizes_mb[i - 1] * MB),)))
        gradient = f"gradient_tape/g{i}"
    return graph(*nodes)


def test_a_target_the_search_ends_above_gets_the_most_conserving_plan_when_that_fits():
    # With copies that overlap, the search restores a swapped map early (hiding its copy) where that frees
    # enough at the current peak; on the BFC model it ended at 24.0 MB for a 23.3-23.9 MB target that the plan
    # conserving every map by the kind that frees most (22.0 MB) meets.
    machine = MachineModel(host_bytes_per_s=1e9, copies_overlap=True)
    analysis = analyze_graph(_chain([1.2, 5.2, 6.0]), machine=machine)
    target = int(23.6 * MB)
    result = choose_conservations(analysis, budget_bytes=1, machine=machine)
    assert not result.fits
    lowest = result.smallest_peak_bytes
    assert lowest <= 22.1 * MB
    plan = _fitting(analysis, budget_bytes=target, machine=machine)
    assert plan.predicted_peak_after_bytes == lowest and plan.target_bytes == target and plan.feasible
    assert any("most-conserving" in note for note in plan.notes)


def _lowest_peak(analysis, machine):
    result = choose_conservations(analysis, budget_bytes=1, allocator="exact", machine=machine)
    assert not result.fits
    return result.smallest_peak_bytes


def test_copies_that_overlap_restore_late_where_early_restores_would_set_the_peak():
    # a transfer of 1 MB takes about three backward ops: restores that hide it start three ops early, so
    # with many layers swapped several restored copies would be on the device at once beside the gradient
    overlapping = MachineModel(host_bytes_per_s=1e9, copies_overlap=True)
    serial = MachineModel(host_bytes_per_s=1e9, copies_overlap=False)
    g = mlp_like(layers=8)
    lowest = _lowest_peak(analyze_graph(g, machine=serial), serial)
    analysis = analyze_graph(g, machine=overlapping)
    assert _lowest_peak(analysis, overlapping) == lowest
    position = {name: i for i, name in enumerate(analysis.order)}

    def late(decision):
        return position[decision.trigger] == position[decision.consumers[0]] - 1

    tight = _fitting(analysis, budget_bytes=lowest, allocator="exact", machine=overlapping)
    assert tight.feasible and tight.decisions and all(late(d) and d.cost_s > 0 for d in tight.decisions)
    looser = _fitting(analysis, budget_bytes=lowest + 2 * MB, allocator="exact", machine=overlapping)
    assert any(late(d) for d in looser.decisions)
    assert all(d.cost_s == 0 for d in looser.decisions if not late(d))  # restores that hide their copy cost nothing
    assert any(d.cost_s == 0 for d in looser.decisions)
    assert looser.predicted_overhead_s < tight.predicted_overhead_s


def _two_branches():
    """x -> fa, fb (4 MB each) -> m0..m4 (1 MB) -> loss; backward h4..h0 (1 MB), then ga and gb (4 MB each)
    both read h0 and one of fa, fb; ca and cb (1 MB) reduce them; the update reads ca and cb. By the ASAP
    estimate ga and gb start together."""
    nodes = [node("x", "Placeholder", outputs=(1024,)), node("fa", "Op", ["x"], outputs=(4 * MB,)),
             node("fb", "Op", ["x"], outputs=(4 * MB,)), node("m0", "Op", ["fa", "fb"], outputs=(MB,))]
    for i in range(1, 5):
        nodes.append(node(f"m{i}", "Op", [f"m{i - 1}"], outputs=(MB,)))
    nodes += [node("loss", "Sum", ["m4"], outputs=(TensorInfo("float32", (), 4),)), node("ones", "Const")]
    gradient = "ones"
    for i in range(4, -1, -1):
        nodes.append(node(f"gradient_tape/h{i}", "Op", [gradient, f"m{i}"], outputs=(MB,)))
        gradient = f"gradient_tape/h{i}"
    for branch in "ab":
        nodes += [node(f"gradient_tape/g{branch}", "Op", [gradient, f"f{branch}"], outputs=(4 * MB,)),
                  node(f"gradient_tape/c{branch}", "Op", [f"gradient_tape/g{branch}"], outputs=(MB,))]
    nodes.append(node("update", "AssignSub", ["gradient_tape/ca", "gradient_tape/cb"], outputs=()))
    return graph(*nodes)


_SERIAL = MachineModel(host_bytes_per_s=1e9, copies_overlap=False)


def _most_conserving(analysis):
    result = choose_conservations(analysis, budget_bytes=1, allocator="exact", machine=_SERIAL, pinned=True)
    assert not result.fits
    return result.plan


def test_the_most_conserving_plan_restores_right_before_the_reader_in_the_pinned_order():
    # Copies that cannot overlap computation. Pinned, ga and gb run one after the other: the second
    # branch's tensor comes back after the first branch's gradient, never beside it (by the ASAP estimate
    # both start together, so an early restore would come before the first).
    plan = _most_conserving(analyze_graph(_two_branches(), machine=_SERIAL))
    position = {name: i for i, name in enumerate(plan.pinned_order)}
    backward = [name for name in plan.pinned_order if name.startswith("gradient_tape/")]
    swapped = {decision.tensor.node: decision for decision in plan.decisions}
    assert set(swapped) >= {"fa", "fb"}
    for decision in swapped.values():
        first = min(position[c] for c in decision.consumers)
        assert decision.trigger == max((n for n in backward if position[n] < first), key=position.get)
    first, second = sorted(("gradient_tape/ga", "gradient_tape/gb"), key=position.get)
    assert swapped["fb" if second.endswith("gb") else "fa"].trigger == first


def test_a_refined_order_finishes_one_branch_before_the_other_and_peaks_lower():
    # Pinned as scheduled, ga and gb run back to back: at the second, the first's 4 MB gradient waits for
    # its reduction beside the second's restored input and output. The most conserving plan swaps that
    # gradient out meanwhile; refined, a branch's reduction runs before the other branch starts, and the
    # plan on that order reaches the same peak swapping fewer bytes.
    analysis = analyze_graph(_two_branches(), machine=_SERIAL)
    plan = _most_conserving(analysis)
    assert {d.tensor.node for d in plan.decisions} == {"fa", "fb", "gradient_tape/ga"}
    feature_maps = dataclasses.replace(plan, decisions=tuple(d for d in plan.decisions if d.tensor.node in ("fa", "fb")))
    refined = refined_pinned_order(analysis, feature_maps)
    assert sorted(refined) == sorted(plan.pinned_order) and refined != plan.pinned_order
    position = {name: i for i, name in enumerate(refined)}
    first = min("ab", key=lambda branch: position[f"gradient_tape/g{branch}"])
    second = "b" if first == "a" else "a"
    assert position[f"gradient_tape/c{first}"] < position[f"gradient_tape/g{second}"]
    again = _most_conserving(dataclasses.replace(analysis, pinned_order=refined))
    assert again.pinned_order == refined
    assert again.predicted_peak_after_bytes <= plan.predicted_peak_after_bytes
    assert again.host_bytes < plan.host_bytes
    rewrite(analysis.graph, again, IdentityBackend()).validate()


def test_only_a_pinned_plan_without_loop_swaps_has_its_order_refined():
    analysis = analyze_graph(_two_branches(), machine=_SERIAL)
    with pytest.raises(ValueError, match="pinned plan"):
        refined_pinned_order(analysis, _fitting(analysis, budget_bytes=12 * MB, allocator="exact", machine=_SERIAL))
