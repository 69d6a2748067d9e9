"""seqmem.plan.candidates: which span of a held backward tensor is offered for conservation."""

from seqmem.analyze.anatomy import analyze_step
from seqmem.ir.graph import TensorInfo, TensorRef
from seqmem.plan.candidates import _held_tensors
from seqmem.sim.simulator import simulate
from tests.builders import graph, node

MB = 1 << 20


def test_a_held_tensor_is_offered_over_its_gap_where_most_bytes_are_live():
    # h waits twice: for r1 over two small nodes, then for r2 over two nodes beside an 8 MB tensor. The gaps
    # are as long; the second is where swapping h lowers the peak.
    g = graph(node("x", "Placeholder", outputs=(MB,)), node("f", "Op", ["x"], outputs=(MB,)),
              node("loss", "Sum", ["f"], outputs=(TensorInfo("float32", (), 4),)), node("ones", "Const"),
              node("gradient_tape/h", "Op", ["ones", "f"], outputs=(2 * MB,)),
              node("gradient_tape/p1", "Op", ["ones"], outputs=(1024,)),
              node("gradient_tape/p2", "Op", ["gradient_tape/p1"], outputs=(1024,)),
              node("gradient_tape/r1", "Op", ["gradient_tape/h", "gradient_tape/p2"], outputs=(1024,)),
              node("gradient_tape/q1", "Op", ["gradient_tape/r1"], outputs=(8 * MB,)),
              node("gradient_tape/q2", "Op", ["gradient_tape/q1"], outputs=(1024,)),
              node("gradient_tape/r2", "Op", ["gradient_tape/h", "gradient_tape/q2"], outputs=(1024,)),
              outputs=("gradient_tape/r2",))
    order = list(g.nodes)
    held = _held_tensors(g, analyze_step(g), simulate(g, order), {name: i for i, name in enumerate(order)})
    assert held[TensorRef("gradient_tape/h")] == ("gradient_tape/r2",)
