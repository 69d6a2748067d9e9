
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef
from seqmem.sim.simulator import simulate
from seqmem.sim.trace import SwapEvent
from tests.builders import graph, node, tensor, training_graph


def _order(g):
    return g.topological_order()


def test_peak_by_hand():
    g = training_graph()
    trace = simulate(g, _order(g))
    device = trace.devices[""]
    assert device.persistent_bytes == 100 + 40 + 4
    assert device.live_bytes == (0, 0, 1000, 3000, 3004, 3000, 5000, 4000, 1000)
    assert device.peak_bytes == 144 + 5000
    assert trace.order[device.peak_step] == "gradient_tape/g2"
    assert dict(device.live_at_peak) == {TensorRef("f1"): 1000, TensorRef("f2"): 2000, TensorRef("gradient_tape/g2"): 2000}


def test_the_bfc_model_measures_a_later_call_as_the_first():
    # 2 MiB region: the variable, the constant, then y; 4 MiB: a; 8 MiB: b, whole (under twice 5 MiB). Were
    # the constant placed as the schedule reaches it, or the first call's result kept, either would split
    # the 4 MiB region a freed: the second call's a would take the 8 MiB one and b not fit in 14 MiB.
    mib = 1 << 20
    g = graph(
        node("v", "VarHandleOp", outputs=(0,), resource_bytes=mib),
        node("y", "Op", outputs=(mib - 256,)),
        node("a", "Op", outputs=(4 * mib,)),
        node("b", "Op", ["a"], outputs=(5 * mib,)),
        node("c", "Const", outputs=(4,)),
        node("out", "Op", ["b", "c", "y"], outputs=(4,)),
        outputs=["out"],
    )
    device = simulate(g, ["v", "y", "a", "b", "c", "out"], allocator="bfc", limit_bytes=14 * mib).devices[""]
    assert device.persistent_bytes == mib + 256
    assert device.peak_bytes == 14 * mib


def test_the_bfc_model_places_a_list_element_by_element():
    # a loop's list of ten 1 MiB elements: ten chunks, unpadded (one 10 MiB chunk would be padded to 16 MiB)
    mib = 1 << 20
    listed = TensorInfo("variant", (), 10 * mib, element_bytes=mib)
    g = graph(node("loop", "While", outputs=(listed,)), node("out", "Op", ["loop"], outputs=(4,)))
    bfc = simulate(g, _order(g), allocator="bfc").devices[""]
    assert bfc.live_bytes[0] == 10 * mib
    whole = graph(node("loop", "While", outputs=(10 * mib,)), node("out", "Op", ["loop"], outputs=(4,)))
    assert simulate(whole, _order(whole), allocator="bfc").devices[""].live_bytes[0] == 16 * mib


def test_the_bfc_model_places_a_filled_lists_elements_as_the_iterations_run():
    # a loop fills a list of two 1 MiB elements, each iteration's body holding 1 MiB. Iteration 1's body and
    # element split the first 2 MiB region; iteration 2's body takes the body's freed chunk back and its
    # element opens a 4 MiB region, whose 3 MiB rest the 2 MiB stack after the loop is handed unsplit (under
    # twice the request): 5 MiB of chunks for 4 MiB of tensors. Placed together, the elements would fill the
    # first region and the stack would split the second: 4 MiB.
    mib = 1 << 20
    listed = TensorInfo("variant", (), 2 * mib, element_bytes=mib)
    g = graph(node("loop", "While", outputs=(listed,)), node("stack", "Op", ["loop"], outputs=(2 * mib,)),
              node("out", "Op", ["stack"], outputs=(4,)))
    bfc = simulate(g, _order(g), allocator="bfc", scratch_bytes={"loop": mib}).devices[""]
    assert bfc.live_bytes[1] == 5 * mib and bfc.tensor_live_bytes[1] == 4 * mib


def test_the_bfc_model_places_a_body_in_pieces_and_a_kernels_scratch_whole():
    # one iteration of a loop holding 10 MiB of its own tensors, in 1 MiB pieces: 11 MiB of chunks (the first
    # 2 MiB region's rest, after the output's 256-byte chunk, is handed whole to one piece); a kernel's 10 MiB
    # scratch buffer as one chunk, padded to 16 MiB as the list above
    mib = 1 << 20
    for op, chunks in (("While", 11 * mib), ("Op", 16 * mib + 256)):
        g = graph(node("step", op, outputs=(4,)), node("out", "Op", ["step"], outputs=(4,)))
        bfc = simulate(g, _order(g), allocator="bfc", scratch_bytes={"step": 10 * mib}).devices[""]
        assert bfc.live_bytes[0] == chunks and bfc.tensor_live_bytes[0] == 10 * mib + 4, op


def test_the_bfc_model_of_a_reserved_arena_pads_only_in_chunks_it_has_freed_or_its_regions():
    # arena of 2 + 16 MiB reserved up front: a list of ten 1 MiB elements unpadded, one 10 MiB output given
    # the 16 MiB region whole; without a limit the second region is unbounded and split exactly
    mib = 1 << 20
    listed = TensorInfo("variant", (), 10 * mib, element_bytes=mib)
    cases = ((listed, 18 * mib, 10 * mib), (10 * mib, 18 * mib, 16 * mib), (10 * mib, None, 10 * mib))
    for output, limit, chunks in cases:
        g = graph(node("loop", "While", outputs=(output,)), node("out", "Op", ["loop"], outputs=(4,)))
        bfc = simulate(g, _order(g), allocator="bfc", limit_bytes=limit, reserved_arena=True).devices[""]
        assert bfc.live_bytes[0] == chunks, (output, limit)


def test_the_bfc_model_places_variables_before_the_step_in_graph_order_whatever_reads_them_first():
    # two 1.5 MiB variables, created (graph order) before a 0.5 MiB transient exists: each takes a chunk of
    # its own region (2 MiB, unsplit, then 1.5 MiB of a 4 MiB one), as in an arena they were created in,
    # also when the step makes the transient before it reads them (placed then, the first variable would
    # share the transient's 2 MiB region: 3.0 MiB of persistent chunks)
    mib = 1 << 20
    g = graph(
        node("a", "Placeholder", outputs=(4,), resource_bytes=3 * mib // 2),
        node("b", "Placeholder", outputs=(4,), resource_bytes=3 * mib // 2),
        node("t", "Op", outputs=(mib // 2,)),
        node("ra", "Op", ["a", "t"], outputs=(4,)),
        node("rb", "Op", ["b", "ra"], outputs=(4,)),
    )
    for order in (["a", "b", "t", "ra", "rb"], ["t", "a", "ra", "b", "rb"]):
        bfc = simulate(g, order, allocator="bfc").devices[""]
        assert bfc.persistent_bytes == 2 * mib + 3 * mib // 2 + 2 * 256, order


def test_the_bfc_model_places_a_loops_constants_before_the_step_each_its_own_buffer():
    # two 1.5 MiB constants a loop's body holds, allocated as TensorFlow instantiates the step, before the
    # 0.5 MiB transient the step makes first: a 2 MiB region handed whole, then 1.5 MiB of a 4 MiB one (as one
    # 3 MiB buffer they would take a 4 MiB region whole)
    mib = 1 << 20
    g = graph(
        node("t", "Op", outputs=(mib // 2,)),
        node("loop", "While", ["t"], outputs=(4,), constant_sizes=(3 * mib // 2, 3 * mib // 2)),
    )
    bfc = simulate(g, ["t", "loop"], allocator="bfc").devices[""]
    assert bfc.persistent_bytes == 2 * mib + 3 * mib // 2


def test_bytes_measured_in_use_before_the_step_replace_the_variables_and_inputs_chunks_not_the_constants():
    # a 1.5 MiB variable and a 1 KiB input, which exist before the step runs, and a 1 MiB folded constant,
    # which the step's first call allocates: 5 MiB measured in use before it stand for the first two alone
    mib = 1 << 20
    g = graph(
        node("v", "Placeholder", outputs=(4,), resource_bytes=3 * mib // 2),
        node("x", "Placeholder", outputs=(1024,)),
        node("c", "Fill", outputs=(mib,), folded=True),
        node("t", "Op", ["v", "x", "c"], outputs=(mib // 2,)),
        node("out", "Op", ["t"], outputs=(4,)),
    )
    order = ["v", "x", "c", "t", "out"]
    modelled = simulate(g, order, allocator="bfc").devices[""]
    measured = simulate(g, order, allocator="bfc", in_use_before_bytes={"": 5 * mib}).devices[""]
    variable_and_input = 2 * mib + 256 + 1024  # the variable's 2 MiB region (unsplit), its handle, the input
    assert measured.persistent_bytes == modelled.persistent_bytes - variable_and_input + 5 * mib
    assert measured.peak_bytes == modelled.peak_bytes - variable_and_input + 5 * mib
    assert measured.live_bytes == modelled.live_bytes
    other_device = simulate(g, order, allocator="bfc", in_use_before_bytes={"GPU:0": 5 * mib}).devices[""]
    assert other_device.peak_bytes == modelled.peak_bytes


def test_views_share_buffers_and_inplace_ops_reuse_dead_inputs():
    g = graph(
        node("x", "Placeholder", outputs=(8,)),
        node("a", "Op", ["x"], outputs=(1000,)),
        node("view", "Reshape", ["a"], outputs=(1000,)),
        node("relu", "Relu", ["view"], outputs=(1000,)),   # a's last reader: writes in place
        node("out", "Op", ["relu"], outputs=(10,)),
    )
    trace = simulate(g, _order(g))
    assert max(trace.devices[""].live_bytes) == 1010
    assert trace.buffer_of[TensorRef("relu")] == TensorRef("a")


def test_a_cast_allocates_even_into_a_type_of_the_same_size():
    g = graph(
        node("x", "Placeholder", outputs=(8,)),
        node("a", "Op", ["x"], outputs=(1000,)),
        node("cast", "Cast", ["a"], outputs=(tensor(1000, dtype="int32"),)),   # a's last reader
        node("out", "Op", ["cast"], outputs=(10,)),
    )
    trace = simulate(g, _order(g))
    assert trace.buffer_of[TensorRef("cast")] == TensorRef("cast")
    assert max(trace.devices[""].live_bytes) == 2000


def test_the_cross_entropy_gradient_takes_the_logits_buffer_once_nothing_else_reads_them():
    def loss_graph(logits_read_later):
        return graph(
            node("x", "Placeholder", outputs=(8,)),
            node("labels", "Placeholder", outputs=(400,)),       # as large as the loss: never its buffer
            node("logits", "Op", ["x"], outputs=(4000,)),
            node("xent", "SparseSoftmaxCrossEntropyWithLogits", ["logits", "labels"], outputs=(400, 4000)),
            node("gradient", "Op", ["xent:1"] + (["logits"] if logits_read_later else []), outputs=(10,)),
            node("out", "Op", ["xent", "gradient"], outputs=(4,)),
        )

    forwarded = simulate(loss_graph(False), _order(loss_graph(False)))
    assert forwarded.buffer_of[TensorRef("xent", 1)] == TensorRef("logits")
    assert max(forwarded.devices[""].live_bytes) == 4000 + 400 + 10
    kept = simulate(loss_graph(True), _order(loss_graph(True)))  # the logits have a reader after it
    assert kept.buffer_of[TensorRef("xent", 1)] == TensorRef("xent", 1)
    assert max(kept.devices[""].live_bytes) == 2 * 4000 + 400 + 10


def test_graph_outputs_live_to_the_end():
    g = graph(node("a", "Op", outputs=(100,)), node("b", "Op", outputs=(5,)), outputs=["a"])
    assert simulate(g, _order(g)).devices[""].live_bytes == (100, 105)


def test_a_loops_carried_values_are_replaced_by_its_outputs_and_its_lists_are_not():
    g = graph(
        node("x", "Placeholder", outputs=(8,)),
        node("sum0", "Op", ["x"], outputs=(1000,)),          # a carried value: the loop's output 0 replaces it
        node("list", "Op", ["x"], outputs=(3000,)),          # a list the loop empties (output 1 is smaller)
        node("loop", "StatelessWhile", ["sum0", "list"], outputs=(1000, 0)),
        node("out", "Op", ["loop", "loop:1"], outputs=(10,)),
    )
    live = simulate(g, _order(g)).devices[""].live_bytes
    assert live[g.topological_order().index("loop")] == 1000 + 3000


def test_swap_moves_a_tensor_off_the_device_between_out_and_in():
    g = training_graph()
    baseline = simulate(g, _order(g)).devices[""]
    # f1 leaves after f2 ran and comes back just before g1 reads it.
    trace = simulate(g, _order(g), [SwapEvent(TensorRef("f1"), "f2", "gradient_tape/g1")])
    swapped = trace.devices[""]
    assert swapped.live_bytes == (0, 0, 1000, 3000, 2004, 2000, 4000, 4000, 1000)
    assert swapped.peak_bytes == baseline.peak_bytes - 1000


def test_a_view_a_backward_reader_makes_of_a_restored_tensor_lives_in_the_copy():
    # t (1000 bytes) leaves after its producer and comes back for v, a view of it (Reshape), read by r
    # later: v lives in the restored copy, freed once r has read it, never in the original again
    g = graph(node("x", "Placeholder", outputs=(4,)), node("t", "Op", ["x"], outputs=(1000,)),
              node("a", "Op", ["x"], outputs=(10,)), node("b", "Op", ["a"], outputs=(10,)),
              node("v", "Reshape", ["t", "b"], outputs=(1000,)), node("r", "Op", ["v"], outputs=(4,)))
    order = ("x", "t", "a", "b", "v", "r")
    trace = simulate(g, order, [SwapEvent(TensorRef("t"), "t", "v")])
    assert trace.devices[""].live_bytes == (0, 1000, 10, 20, 1010, 1004)
    assert trace.buffer_of[TensorRef("v")] == TensorRef("t")


def test_a_host_copys_handle_stays_on_the_device_from_its_producer_until_the_copy_is_back():
    # the emulated device's swap-out, right after f1's producer, leaves a 24-byte string in the arena; the
    # restore reads it and frees it before g1 runs
    g = training_graph()
    trace = simulate(g, _order(g), [SwapEvent(TensorRef("f1"), "f2", "gradient_tape/g1", handle_bytes=24)])
    assert trace.devices[""].live_bytes == (0, 0, 1000, 3024, 2028, 2024, 4024, 4000, 1000)


def test_copies_a_conditional_restores_in_its_branches_come_back_one_at_a_time():
    # g1 (1000 bytes) and g2 (3000) wait for a conditional that applies them; swapped after their finite
    # check, restored for it: as inputs both are back while it runs (with check's and work's outputs, and
    # its own); restored in its branches, only the larger
    def step(in_branch):
        g = graph(node("x", "Placeholder", outputs=(4,)), node("g1", "Op", ["x"], outputs=(1000,)),
                  node("g2", "Op", ["x"], outputs=(3000,)), node("check", "Op", ["g1", "g2"], outputs=(4,)),
                  node("work", "Op", ["x"], outputs=(500,)), node("cond", "If", ["check", "g1", "g2", "work"],
                                                               outputs=(4,)))
        order = ("x", "g1", "g2", "check", "work", "cond")
        events = [SwapEvent(TensorRef(name), "check", "cond", in_branch=in_branch) for name in ("g1", "g2")]
        return simulate(g, order, events).devices[""].live_bytes

    assert step(False) == (0, 1000, 4000, 4004, 504, 4508)
    assert step(True) == (0, 1000, 4000, 4004, 504, 3508)


@pytest.mark.parametrize(
    "event, message",
    [
        (SwapEvent(TensorRef("f1"), "gradient_tape/g1", "f2"), "need producer <= out_after < in_before"),
        (SwapEvent(TensorRef("f1"), "f2", "nope"), "names node 'nope'"),
    ],
)
def test_bad_swaps_are_rejected(event, message):
    g = training_graph()
    with pytest.raises(ValueError, match=message):
        simulate(g, _order(g), [event])


def test_bad_order_is_rejected():
    g = training_graph()
    with pytest.raises(ValueError, match="before its input"):
        simulate(g, tuple(reversed(_order(g))))
    with pytest.raises(ValueError, match="exactly once"):
        simulate(g, _order(g)[:-1])


@st.composite
def random_dags(draw):
    count = draw(st.integers(2, 25))
    nodes = []
    for i in range(count):
        preds = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        sizes = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=2))
        op = draw(st.sampled_from(["Op", "Relu", "Identity", "Placeholder"])) if not preds else draw(
            st.sampled_from(["Op", "Relu", "Identity", "AddV2"]))
        outputs = tuple(TensorInfo("float32", (s // 4,), s - s % 4) for s in sizes)
        inputs = tuple(TensorRef(f"n{p}", 0) for p in preds)
        nodes.append(Node(f"n{i}", op, inputs=inputs, outputs=outputs))
    return Graph(nodes)


@settings(max_examples=200, deadline=None)
@given(random_dags())
def test_random_dag_invariants(g):
    order = g.topological_order()
    position = {name: i for i, name in enumerate(order)}
    for name in order:
        assert all(position[p] < position[name] for p in g.predecessors(name))
    trace = simulate(g, order)
    device = trace.devices[""]
    for name in order:
        node = g.node(name)
        touched = set(node.inputs) | {TensorRef(name, i) for i in range(len(node.outputs))}
        buffers = {trace.buffer_of[ref] for ref in touched}
        working_set = sum(g.tensor(b).size_bytes for b in buffers if g.node(b.node).op != "Placeholder")
        assert device.peak_bytes >= working_set
    for ref, owner in trace.buffer_of.items():
        readers = [position[r] for r in g.consumers(ref)]
        start, end = trace.lifetimes[owner]
        if readers and end >= 0:
            assert end >= max(readers), f"{owner} freed at {end} before its reader at {max(readers)}"


@settings(max_examples=50, deadline=None)
@given(random_dags())
def test_bfc_trace_also_counts_the_exact_tensor_bytes(g):
    order = g.topological_order()
    exact = simulate(g, order).devices[""]
    bfc = simulate(g, order, allocator="bfc").devices[""]
    assert bfc.tensor_live_bytes == exact.live_bytes == exact.tensor_live_bytes
    assert bfc.tensor_peak_bytes == exact.peak_bytes
    assert bfc.peak_bytes >= exact.peak_bytes


def test_add_n_sums_into_an_input_no_one_reads_later():
    def summed(a_read_later):
        return graph(
            node("x", "Placeholder", outputs=(8,)),
            node("a", "Op", ["x"], outputs=(1000,)),
            node("b", "Op", ["x"], outputs=(1000,)),
            node("sum", "AddN", ["a", "b"], outputs=(1000,)),
            node("out", "Op", ["sum"] + (["a"] if a_read_later else []), outputs=(10,)),
        )

    trace = simulate(summed(False), _order(summed(False)))
    assert trace.buffer_of[TensorRef("sum")] == TensorRef("a")
    assert max(trace.devices[""].live_bytes) == 2000
    later = simulate(summed(True), _order(summed(True)))  # a has a reader after the sum: b's buffer
    assert later.buffer_of[TensorRef("sum")] == TensorRef("b")


def test_nodes_placed_on_the_default_device_by_name_share_its_memory():
    # tf.distribute places a worker's ops on "/job:worker/replica:0/task:0/device:CPU:0"; its variables'
    # handles stay unplaced: on the emulated device both are one arena
    placed = "/job:worker/replica:0/task:0/device:CPU:0"
    steps = graph(node("a", "Op", outputs=(1000,)), node("b", "Op", ["a"], outputs=(500,), device=placed),
                  node("c", "Op", ["b"], outputs=(4,)))
    order = ["a", "b", "c"]
    assert set(simulate(steps, order).devices) == {"", "CPU:0"}
    merged = simulate(steps, order, default_device="CPU:0")
    assert set(merged.devices) == {""} and merged.peak_bytes == 1500
