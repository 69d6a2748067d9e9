from seqmem.ir.op_tables import PRODUCT_OPS, SUM_OPS
from seqmem.ir.regrouped import regrouped_nodes, regrouped_pairs
from tests.builders import graph, node


def test_a_sum_or_product_read_alone_by_one_of_its_kind_is_regrouped_with_its_reader():
    ops = {"x": "Placeholder", "inner": "Mul", "outer": "Mul", "shared": "Mul", "sum": "AddV2", "total": "AddN",
           "diff": "Sub", "ratio": "RealDiv", "exp": "Exp"}
    readers = {"x": ["inner", "shared", "shared"], "inner": ["outer"], "outer": ["sum"], "sum": ["total"],
               "shared": ["outer", "exp"], "diff": ["ratio"], "exp": ["diff"]}
    # inner: a product read by a product alone; sum: by a sum; diff: a difference read by a product is not
    assert regrouped_nodes(ops, readers, (SUM_OPS, PRODUCT_OPS)) == {"inner", "outer", "sum", "total"}
    assert regrouped_nodes(ops, readers, (PRODUCT_OPS,)) == {"inner", "outer"}


def test_a_node_read_twice_by_one_reader_is_not_regrouped():
    g = graph(node("x", "Placeholder"), node("square", "Mul", ["x", "x"]), node("twice", "Mul", ["square", "square"]))
    assert regrouped_pairs(g) == frozenset()


def test_a_sum_read_alone_by_a_sum_is_regrouped_in_a_step():
    """Grappler collapses the tree into one AddN and sorts its inputs by name: left chained, (b + c) + a
    would round otherwise than the original's a + b + c."""
    g = graph(*(node(name, "Placeholder") for name in "abc"), node("inner", "AddV2", ["b", "c"]),
              node("outer", "AddV2", ["inner", "a"]))
    assert regrouped_pairs(g) == {"inner", "outer"}
