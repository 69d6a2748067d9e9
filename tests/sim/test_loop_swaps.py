"""seqmem.sim.loop_swaps: a loop-swapped list is sized as its host buffers' handles, plus a window per loop."""

import pytest

from seqmem.ir.graph import TensorRef
from seqmem.sim.calls import CallCharge
from seqmem.sim.loop_swaps import SERIALIZED_ELEMENT_BYTES, iterations, with_loop_swaps
from tests.builders import loop_training_graph

MB = 1 << 20


def test_a_swapped_list_keeps_one_handle_per_iteration_and_each_loop_a_window_of_depth_elements():
    g, swap = loop_training_graph(iterations=10, element_bytes=MB)
    assert iterations(g, swap) == 10
    swapped, scratch = with_loop_swaps(g, {"fwd": 5, "head": 7}, [swap], depth=2)
    assert swapped.tensor(TensorRef("fwd", 1)).size_bytes == 10 * SERIALIZED_ELEMENT_BYTES
    assert swapped.tensor(TensorRef("fwd", 0)).size_bytes == MB  # the loop's other outputs stay
    assert scratch == {"fwd": 5 + 2 * MB, "head": 7, "gradient_tape/while_grad": 2 * MB}
    assert g.tensor(TensorRef("fwd", 1)).size_bytes == 10 * MB  # the input graph is unchanged


def test_a_list_of_unknown_size_is_refused():
    g, swap = loop_training_graph()
    unsized = swap.__class__(**{**swap.__dict__, "element_bytes": None})
    with pytest.raises(ValueError, match="unknown size.*acc"):
        with_loop_swaps(g, {}, [unsized], depth=1)


def test_a_call_that_frees_a_list_it_pops_is_charged_again_for_the_lists_swapped_size():
    g, swap = loop_training_graph(iterations=10, element_bytes=MB)
    # the gradient node's body holds 2 MB while it pops the list (input 1), then 9 MB once it has freed it
    charge = CallCharge(peaks=((2 * MB, ()), (9 * MB, (1,))), returned_bytes=0)
    grad = "gradient_tape/while_grad"
    assert charge.bytes(lambda index: g.tensor(g.node(grad).inputs[index]).size_bytes) == 2 * MB
    _, scratch = with_loop_swaps(g, {grad: 2 * MB}, [swap], depth=2, calls={grad: charge})
    # swapped, the list frees only its handles: the 9 MB stretch counts, and the window of 2 elements
    assert scratch[grad] == 9 * MB - 10 * SERIALIZED_ELEMENT_BYTES + 2 * MB
