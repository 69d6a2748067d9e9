"""seqmem.sim.loop_swaps: a loop-swapped list is sized as its host buffers' handles, plus a window per loop."""

import pytest

from seqmem.ir.graph import TensorRef
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
