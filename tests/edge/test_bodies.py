"""seqmem.edge.bodies: what one iteration of a loop's body, or a called function's, holds beyond the node's inputs and outputs."""

import tensorflow as tf

from seqmem.edge import capture
from seqmem.edge.bodies import body_bytes, body_memory, handed_over
from seqmem.edge.variable_shapes import variable_shapes
from tests.keras_steps import conditional_update_step

_MIB = 1 << 20


def _graph_def(body):
    """A function running `body` over (i, h), h a [256, 256] float32 (256 KiB) loop variable, 3 times."""

    @tf.function(autograph=False)
    def step(h):
        return tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), h))[1]

    return step.get_concrete_function(tf.TensorSpec([256, 256])).graph.as_graph_def()


def test_an_iterations_intermediates_count_and_the_loop_variables_do_not():
    # h -> [256, 4096] (4 MiB) -> reduced back to [256, 256]: the wide intermediate is the body's
    wide = tf.ones([256, 4096])
    graph_def = _graph_def(lambda i, h: (i + 1, tf.reshape(tf.reduce_sum(tf.reshape(tf.tile(h, [1, 16]) * wide,
                                                                                    [256, 256, 16]), -1), [256, 256])))
    (loop, held), = body_bytes(graph_def).items()
    assert "while" in loop
    # the tiled copy (4 MiB; the product is written into it) and the sum (256 KiB); `wide` is captured, an
    # argument like the loop variables
    assert 0 <= held - (4 * _MIB + (256 << 10)) < 1024  # and the counter's scalars


def test_a_loops_iteration_is_its_buffers_in_order_and_the_elements_it_writes():
    @tf.function(autograph=False)
    def step(h):
        def body(i, h, out):
            h = tf.reshape(tf.reduce_sum(tf.reshape(tf.tile(h, [1, 16]), [256, 256, 16]), -1), [256, 256])
            return i + 1, h, out.write(i, tf.sin(h))

        out = tf.TensorArray(tf.float32, size=3)
        return tf.while_loop(lambda i, *_: i < 3, body, (tf.constant(0), h, out))[2].stack()

    graph_def = step.get_concrete_function(tf.TensorSpec([256, 256])).graph.as_graph_def()
    charges, iterations, _, _ = body_memory(graph_def)
    (loop, iteration), = iterations.items()
    assert iteration.peak_bytes == charges[loop]
    assert max(size for size, _, _ in iteration.buffers) == 4 * _MIB  # the tiled copy
    # sin(h), written to the TensorArray's list: the While's output 4 (after its iteration counter and bound, i
    # and h)
    (output, written), = iteration.elements
    assert output == 4 and 0 < written < iteration.steps


def test_an_iterations_constants_are_the_loops_not_its_scratch():
    # the body's fill (256 KiB) is held across steps, booked on the loop (`seqmem.edge.folded_constants`)
    graph_def = _graph_def(lambda i, h: (i + 1, h * tf.fill([256, 256], 3.0)))
    assert 0 <= max(body_bytes(graph_def).values()) - (256 << 10) < 1024  # the product, and the counter's scalars


def test_a_loop_that_only_passes_its_variables_on_holds_nothing():
    graph_def = _graph_def(lambda i, h: (i + 1, h))
    assert max(body_bytes(graph_def).values()) < 1024  # the counter's scalars


def test_elements_read_from_a_list_are_the_lists_bytes():
    @tf.function(autograph=False)
    def step(sequence):
        elements = tf.TensorArray(tf.float32, size=3).unstack(sequence)
        return tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, h @ elements.read(i)),
                             (tf.constant(0), tf.zeros([256, 256])))[1]

    graph_def = step.get_concrete_function(tf.TensorSpec([3, 256, 256])).graph.as_graph_def()
    # the product is 256 KiB; the element read (256 KiB) is the list's, not counted again
    assert max(body_bytes(graph_def).values()) < (256 << 10) + 1024


def test_a_calls_intermediates_count_and_what_it_returns_does_not():
    @tf.function(autograph=False)
    def inner(h):
        wide = tf.tile(h, [1, 16])  # [256, 4096]: 4 MiB, the call's own
        return tf.reduce_sum(tf.reshape(wide, [256, 256, 16]), -1), tf.identity(h)

    @tf.function(autograph=False)
    def step(h):
        total, same = inner(h)
        return total + same

    graph_def = step.get_concrete_function(tf.TensorSpec([256, 256])).graph.as_graph_def()
    (call, held), = body_bytes(graph_def).items()
    assert "Call" in graph_def.node[[n.name for n in graph_def.node].index(call)].op
    # the tiled copy; the sum (256 KiB) is returned, the call's output, and h is its argument
    assert 0 <= held - 4 * _MIB < 1024


def test_a_call_is_charged_its_peak_less_what_it_returns_which_the_call_holds_throughout():
    @tf.function(autograph=False)
    def inner(h):
        total = tf.reduce_sum(tf.tile(h, [1, 16]))  # a 4 MiB intermediate, freed once summed
        return tf.tile(h * total, [1, 16])  # then a 4 MiB result: the call's output

    @tf.function(autograph=False)
    def step(h):
        return inner(h)

    graph_def = step.get_concrete_function(tf.TensorSpec([256, 256])).graph.as_graph_def()
    (_, held), = body_bytes(graph_def).items()
    # peak 4 MiB + 256 KiB (the product, tiled into the result) less the 4 MiB returned; the call's output
    # (4 MiB) is live for the whole call, so the body's 4 MiB intermediate is not counted beside it
    assert 0 <= held - (256 << 10) < 1024


def test_an_iteration_runs_in_the_executors_order_each_term_added_to_its_sum_as_it_comes():
    @tf.function(autograph=False)
    def step(h):
        zeros = tf.zeros([256, 4096])

        def body(i, h, a, b, c):  # three [256, 4096] sums (4 MiB each), as a gradient loop sums its weights'
            wide = tf.tile(h, [1, 16])
            return i + 1, h, a + tf.sin(wide), b + tf.cos(wide), c + tf.exp(wide)

        return tf.while_loop(lambda i, *_: i < 3, body, (tf.constant(0), h, zeros, zeros, zeros))[2:]

    graph_def = step.get_concrete_function(tf.TensorSpec([256, 256])).graph.as_graph_def()
    (_, held), = body_bytes(graph_def).items()
    # the tiled input and one term at a time (each sum's new value is written into its term); in
    # topological order all three terms would be live at once, 16 MiB
    assert 0 <= held - 8 * _MIB < 1024


def test_a_conditionals_branch_runs_in_the_executors_order_every_gradients_product_made_before_an_update():
    function, _variables, _optimizer = conditional_update_step(4)  # four 1 MiB variables, updated in a conditional's branch
    graph_def, shapes = function.graph.as_graph_def(), variable_shapes(capture.from_tf(function))
    (_, held), = body_bytes(graph_def, variables=shapes).items()
    # each gradient times the learning rate (the four products are ready at once, and the executor runs them
    # before any update), then one momentum slot times the momentum
    assert 0 <= held - 5 * _MIB < 1024
    # a pinned step runs the branch in its own order, one variable's update after another
    (_, pinned), = body_memory(graph_def, variables=shapes)[3].items()
    assert 0 <= pinned - 2 * _MIB < 1024


def test_a_gradient_iteration_is_sized_from_the_elements_it_pops():
    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h) * h), (tf.constant(0), x))[1]
            loss = tf.reduce_sum(h)
        return tape.gradient(loss, x)

    graph_def = step.get_concrete_function(tf.TensorSpec([256, 1024])).graph.as_graph_def()
    gradient = [held for name, held in body_bytes(graph_def).items() if "grad" in name]
    # d(tanh(h) * h) from the popped h and tanh(h): two [256, 1024] float32 products (1 MiB each) live at once;
    # sized 0 while the popped elements' shapes are unknown in the body
    assert len(gradient) == 1 and 0 <= gradient[0] - 2 * _MIB < 1024


def _handing(inner, reads_twice=False):
    """body_bytes of a step calling `inner` on sin(h), h a [512, 512] float32 (1 MiB), with `handed_over`;
    with `reads_twice`, the step reads sin(h) again after the call."""

    @tf.function(autograph=False)
    def step(h):
        a = tf.sin(h)
        out = inner(a)
        return out + tf.reduce_sum(a) if reads_twice else out

    graph = capture.from_tf(step.get_concrete_function(tf.TensorSpec([512, 512])))
    handed = handed_over(graph)
    (call, held), = body_bytes(capture.to_graph_def(graph), handed).items()
    return handed.get(call, {}), held


@tf.function(autograph=False)
def _transposed_then_tiled(a):
    t = tf.transpose(a)  # 1 MiB beside the argument
    return tf.reduce_sum(tf.tile(t, [1, 2]))  # 2 MiB beside t, once the argument is freed


def test_an_argument_only_its_call_reads_is_freed_inside_the_call():
    handed, held = _handing(_transposed_then_tiled)
    assert handed == {0: _MIB}
    # peak: t and the tiled copy (3 MiB), the argument freed by then; less the argument, counted as the
    # call's input: held for the whole call, it was charged 3 MiB
    assert abs(held - 2 * _MIB) < 1024  # (less the 4 bytes returned)


def test_an_argument_read_after_the_call_is_held_throughout_it():
    handed, held = _handing(_transposed_then_tiled, reads_twice=True)
    assert handed == {}
    assert abs(held - 3 * _MIB) < 1024


def test_a_gradient_iteration_is_sized_from_the_masks_it_pops_too():
    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.where(h > 0, tf.tanh(h), h)),
                              (tf.constant(0), x))[1]
            loss = tf.reduce_sum(h)
        return tape.gradient(loss, x)

    graph_def = step.get_concrete_function(tf.TensorSpec([256, 1024])).graph.as_graph_def()
    gradient = [held for name, held in body_bytes(graph_def).items() if "grad" in name]
    # two [256, 1024] float32 gradients (1 MiB each) computed from the popped boolean mask live at once; with
    # the mask's shape unknown in the body, the select's gradient and what follows from it were sized 0
    assert len(gradient) == 1 and 0 <= gradient[0] - 2 * _MIB < 1024


def test_a_gradient_call_frees_the_lists_its_loop_pops_and_holds_a_list_it_only_reads():
    @tf.function(autograph=False)
    def inner(x):  # reads a row of x per iteration from its unstacked list, as a Keras RNN reads its inputs
        rows = tf.TensorArray(tf.float32, size=4).unstack(x)
        return tf.reduce_sum(tf.while_loop(lambda i, h: i < 4, lambda i, h: (i + 1, tf.tanh(h) * rows.read(i)),
                                           (tf.constant(0), tf.zeros([256, 1024])))[1])

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = inner(tf.sin(x))
        return tape.gradient(loss, x)

    graph = capture.from_tf(step.get_concrete_function(tf.TensorSpec([4, 256, 1024])))
    handed = handed_over(graph)
    charges, _, calls, _ = body_memory(capture.to_graph_def(graph), handed)
    (gradient, node), = [(name, node) for name, node in graph.nodes.items() if node.inputs and
                         node.op == "PartitionedCall" and node.inputs[0].node == "ones"]
    lists = {index: graph.tensor(ref).size_bytes for index, ref in enumerate(node.inputs)
             if graph.tensor(ref).element_bytes == _MIB}  # the unstacked rows, the saved tanh(h): 4 MiB each
    freed = {index for index in lists if any(index in before for _, before in calls[gradient].peaks)}
    assert len(lists) == 2 and set(lists) <= set(handed[gradient])  # only the call reads either
    assert len(freed) == 1  # the saved tanh(h), popped by the gradient loop; the rows list is only read
    assert charges[gradient] == calls[gradient].bytes(lambda index: graph.tensor(node.inputs[index]).size_bytes or 0)
