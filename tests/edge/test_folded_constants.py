"""seqmem.edge.folded_constants: constants a step and its called functions hold once TensorFlow has folded them."""

import tensorflow as tf

from seqmem.edge.capture import from_tf
from seqmem.edge.folded_constants import MAX_FOLDED_BYTES, constant_ops, folded_ops, held_constants
from seqmem.edge.library import FunctionBodies
from seqmem.ir.graph import TensorRef, view_source
from seqmem.sim.simulator import simulate

_SPEC = tf.TensorSpec([1000], tf.float32)  # 4000 bytes


def _constant_bytes(outer):
    function = outer.get_concrete_function(_SPEC)
    bodies = FunctionBodies(function.graph.as_graph_def().library)
    held = held_constants(function.graph, bodies, constant_ops(function.graph))
    return {name: sum(sizes) for name, sizes in held.items()}


def _folded(step):
    graph = step.get_concrete_function(_SPEC).graph
    return folded_ops(graph, constant_ops(graph))


def test_zeros_of_a_known_shape_and_what_folds_from_them_are_held():
    @tf.function(autograph=False)
    def inner(x):
        return x * (tf.zeros_like(x) + 3.0)  # ZerosLike becomes a constant, the sum folds: one [1000] held

    @tf.function(autograph=False)
    def outer(x):
        return inner(x)

    (call, held), = _constant_bytes(outer).items()
    assert 4000 <= held < 4000 + 64  # and the scalar 3.0


def test_a_constant_the_caller_passes_folds_inside_the_call():
    @tf.function(autograph=False)
    def inner(x, z):
        return x + z * 3.0

    @tf.function(autograph=False)
    def outer(x):
        return inner(x, tf.zeros([1000]))

    assert 4000 <= max(_constant_bytes(outer).values()) < 4000 + 64


def test_what_reads_a_computed_value_is_not_folded():
    @tf.function(autograph=False)
    def inner(x):
        return tf.exp(x) * 3.0

    @tf.function(autograph=False)
    def outer(x):
        return inner(x)

    assert max(_constant_bytes(outer).values()) < 64  # the scalar 3.0 only


def test_results_over_the_folding_limit_stay_computed():
    rows = MAX_FOLDED_BYTES // 4000 + 1  # [rows, 1000] float32: just over 10 MiB

    @tf.function(autograph=False)
    def inner(x):
        return x + tf.tile(tf.ones([1, 1000]), [rows, 1])  # ones [1, 1000] is folded; the tile is too large

    @tf.function(autograph=False)
    def outer(x):
        return inner(x)

    assert max(_constant_bytes(outer).values()) < 4000 + 64


def test_capture_books_them_on_the_call_node():
    @tf.function(autograph=False)
    def inner(x):
        return x * (tf.zeros_like(x) + 3.0)

    @tf.function(autograph=False)
    def outer(x):
        return inner(x)

    graph = from_tf(outer, [_SPEC])
    calls = [node for node in graph.nodes.values() if node.op in ("PartitionedCall", "StatefulPartitionedCall")]
    assert len(calls) == 1 and sum(calls[0].constant_sizes) >= 4000


def test_zeros_added_and_ones_multiplied_are_simplified_away():
    # Grappler replaces x + 0 and x * 1 by x (measured on the emulated device: nothing held)
    @tf.function(autograph=False)
    def inner(x):
        return (x + tf.zeros_like(x)) * tf.ones_like(x) + tf.fill([1000], 0.0)

    @tf.function(autograph=False)
    def outer(x):
        return inner(x)

    assert max(_constant_bytes(outer).values()) == 0


def test_the_steps_own_folded_nodes_are_persistent():
    # measured on the emulated device: a step reading fill([2048, 1024], 3.0) holds its 8 MB across steps
    @tf.function(autograph=False)
    def step(x):
        return tf.reduce_sum(x * tf.fill([1000], 3.0, name="threes") + tf.zeros_like(x))

    assert _folded(step) == {"threes"}  # the zeros are simplified away
    graph = from_tf(step, [_SPEC])
    assert graph.node("threes").folded and graph.node("threes").persistent
    trace = simulate(graph, graph.topological_order())
    assert trace.busiest().persistent_bytes >= 2 * 4000  # the input and the folded fill


def test_a_fill_of_a_variables_shape_is_computed_every_step():
    # measured on the emulated device: zeros of a VariableShape, as a gradient loop zeroes a variable's
    # gradient, held nothing after the first call (Grappler materializes a Fill only of constant inputs)
    variable = tf.Variable(tf.ones([1000]))

    @tf.function(autograph=False)
    def step(x):
        zeros = tf.zeros(tf.raw_ops.VariableShape(input=variable.handle), name="zeros")
        return tf.reduce_sum(tf.concat([zeros, x], 0))

    assert _folded(step) == frozenset()


def test_a_loop_holds_the_constants_its_body_reads_and_not_those_nothing_reads():
    # measured on the emulated device: a loop multiplying by a 16 MiB constant holds it from its first call
    # on; the NMT step's gradient loop body has 15.0 MB of zeros nothing reads, and none of them is held
    @tf.function(autograph=False)
    def step(x):
        def body(i, h):
            tf.constant(1.0, shape=[5000], name="unread")  # 20000 bytes, pruned
            return i + 1, h * tf.fill([1000], 3.0)

        return tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))[1]

    graph = from_tf(step, [_SPEC])
    (loop, held), = _constant_bytes(step).items()
    assert graph.node(loop).op in ("While", "StatelessWhile")
    assert 4000 <= held < 4000 + 64  # the fill of threes, and the scalars of the counter and condition
    assert sum(graph.node(loop).constant_sizes) == held


def test_x_times_one_is_x_and_allocates_nothing():
    # tf.nn.silu multiplies by a constant beta of 1 in forward and backward; Grappler replaces x * 1 with x
    @tf.function(autograph=False)
    def step(x):
        scaled = tf.constant(1.0) * tf.exp(x)
        return scaled / 1.0 + tf.zeros([1000]), x * 2.0

    graph = from_tf(step, [_SPEC])
    exp = "Exp:0"
    passed = {name: view_source(node, 0) for name, node in graph.nodes.items()
              if node.op in ("Mul", "RealDiv", "AddV2")}
    assert {name: str(ref) if ref else None for name, ref in passed.items()} == {
        "mul": exp, "truediv": "mul:0", "add": "truediv:0", "mul_1": None}
    buffer_of = simulate(graph, graph.topological_order(), allocator="exact").buffer_of
    assert {str(buffer_of[TensorRef(name, 0)]) for name in ("mul", "truediv", "add")} == {exp}
