import pytest

from seqmem.decisions.plan import Decision, Plan
from seqmem.ir.graph import TensorRef
from seqmem.rewrite.conservations import rewrite
from tests.builders import IdentityBackend, graph, node


@pytest.mark.parametrize("index, other", [(0, "f1/read"), (0, "f1:1"), (0, "e"), (0, "g"), (1, "f1/read"), (1, "f1_a")])
def test_a_restored_copy_sorts_among_its_readers_inputs_as_the_tensor_it_replaces(index, other):
    # Grappler sorts a commutative op's inputs by name before it regroups sums and products
    g = graph(node("x", "Placeholder"), node("f1", "Op", ["x"], outputs=(1000, 1000)),
              node("g", "Op", ["x"]), node("grad", "Op", [f"f1:{index}", "g"]))
    decision = Decision(TensorRef("f1", index), 1000, ("grad",), "g", 0.0)
    restored = next(ref.node for ref in rewrite(g, Plan(10_000, 10_000, 5000, 4000, decisions=(decision,)),
                                                IdentityBackend()).node("grad").inputs if ref.node != "g")
    original = "f1" if index == 0 else f"f1:{index}"
    assert (restored < other) == (original < other)
