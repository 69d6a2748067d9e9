import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.ops.gen_resource_variable_ops import read_variable_op

from seqmem.edge import capture
from seqmem.edge.in_place import (COPY_ON_READ_OFF_BEFORE_SUFFIX, COPY_ON_READ_OFF_SUFFIX, WHOLE_SLICE_PREFIX,
                                    assign_in_place)
from seqmem.ir.graph import TensorInfo, TensorRef
from seqmem.runtime.measure import _copies_on_read
from seqmem.edge.runner import graph_def_runner
from tests.builders import graph, node


def _assigning(value_shape=(4,), read_shape=(4,), dtype="float32", handle_op="Placeholder"):
    """handle -> read (read_shape) -> value (value_shape, dtype) -> assign, as Keras' momentum update."""
    float32 = attr_value_pb2.AttrValue(type=tf.float32.as_datatype_enum)
    return graph(
        node("m", handle_op, outputs=(TensorInfo("resource", (), 0),)),
        node("read", "ReadVariableOp", ["m"], outputs=(TensorInfo("float32", read_shape, 16),)),
        node("value", "Mul", ["read"], outputs=(TensorInfo(dtype, value_shape, 16),)),
        node("ready", "NoOp", outputs=()),
        node("assign", "AssignVariableOp", ["m", "value"], outputs=(), control=["ready"], attrs={"dtype": float32}),
        node("sink", "NoOp", outputs=(), control=["assign", "ready"]),
    )


def _original_then_rewritten(step, variable, start, arg):
    """`step`'s GraphDef rewritten by `assign_in_place` and a runner of it; the losses of three original
    steps on `arg` and `variable`'s value after them. `variable` is then reset to `start`."""
    function = step.get_concrete_function(arg)
    in_place = capture.to_graph_def(assign_in_place(capture.from_tf(function)))
    losses = [float(step(arg)) for _ in range(3)]
    expected = variable.numpy()
    variable.assign(start)
    return in_place, graph_def_runner(function, in_place), losses, expected


def test_an_assignment_becomes_a_whole_slice_assignment_with_its_inputs_and_control_inputs():
    in_place = assign_in_place(_assigning())
    in_place.validate()
    assign = in_place.node("assign")
    assert assign.op == "ResourceStridedSliceAssign"
    assert assign.inputs == (TensorRef("m"), TensorRef(f"{WHOLE_SLICE_PREFIX}/begin"),
                             TensorRef(f"{WHOLE_SLICE_PREFIX}/end"), TensorRef(f"{WHOLE_SLICE_PREFIX}/strides"),
                             TensorRef("value"))
    assert assign.control_inputs == ("ready",)
    assert assign.attrs["begin_mask"].i == assign.attrs["end_mask"].i == 1
    assert assign.attrs["T"].type == tf.float32.as_datatype_enum
    off = in_place.node(f"assign/{COPY_ON_READ_OFF_SUFFIX}")
    assert (off.op, off.inputs, off.control_inputs) == ("DisableCopyOnRead", (TensorRef("m"),), ("assign",))
    assert in_place.node("sink").control_inputs == (off.name, "ready")


def test_scalars_unknown_or_other_shapes_non_numeric_values_and_initializers_are_left_alone():
    for case in (_assigning((), ()), _assigning((None,), (None,)), _assigning((4,), (5,)),
                 _assigning(dtype="variant"), _assigning(handle_op="VarHandleOp")):
        assert assign_in_place(case) is case


def test_the_rewritten_step_computes_what_the_original_did_bit_for_bit():
    start = tf.random.stateless_normal([64, 32], seed=[0, 1])
    m = tf.Variable(start)

    @tf.function
    def step(g):
        m.assign(g * 0.1 + m * 0.9)
        return tf.reduce_sum(m)

    g = tf.random.stateless_normal([64, 32], seed=[0, 2])
    in_place, runner, losses, expected = _original_then_rewritten(step, m, start, g)
    assert "ResourceStridedSliceAssign" in {n.op for n in in_place.node}
    assert [float(runner(g)[0]) for _ in range(3)] == losses
    np.testing.assert_array_equal(m.numpy(), expected)
    assert not _copies_on_read(m.handle, read_variable_op(m.handle, tf.float32))  # reads are the buffer again


def _updating(sparse_op="ResourceGather"):
    """An embedding's handle read by `sparse_op`, then updated by AssignAddVariableOp, as Keras' SGD does."""
    return graph(
        node("embedding", "Placeholder", outputs=(TensorInfo("resource", (), 0),)),
        node("ids", "Placeholder", outputs=(TensorInfo("int32", (3,), 12),)),
        node("rows", sparse_op, ["embedding", "ids"], outputs=(TensorInfo("float32", (3, 4), 48),)),
        node("delta", "Mul", ["rows"], outputs=(TensorInfo("float32", (5, 4), 80),)),
        node("ready", "NoOp", outputs=()),
        node("update", "AssignAddVariableOp", ["embedding", "delta"], outputs=(), control=["ready"]),
    )


def test_an_update_of_a_variable_a_sparse_op_reads_first_turns_copy_on_read_off():
    in_place = assign_in_place(_updating())
    in_place.validate()
    off = in_place.node(f"update/{COPY_ON_READ_OFF_BEFORE_SUFFIX}")
    assert (off.op, off.inputs, off.control_inputs) == ("DisableCopyOnRead", (TensorRef("embedding"),),
                                                         ("delta", "ready"))
    update = in_place.node("update")
    assert (update.op, update.control_inputs) == ("AssignAddVariableOp", ("ready", off.name))
    dense = _updating(sparse_op="Mul")
    assert assign_in_place(dense) is dense


def test_an_embedding_updated_after_its_gather_stays_in_its_buffer_bit_for_bit():
    start = tf.random.stateless_normal([50, 8], seed=[0, 3])
    embedding = tf.Variable(start)

    @tf.function
    def step(ids):
        rows = tf.gather(embedding, ids)  # ResourceGather: copy-on-read mode from here
        embedding.assign_add(tf.ones_like(embedding) * tf.reduce_sum(rows) * 1e-3)
        return tf.reduce_sum(embedding)

    ids = tf.constant([1, 7, 7, 30])
    in_place, runner, losses, expected = _original_then_rewritten(step, embedding, start, ids)
    assert "DisableCopyOnRead" in {n.op for n in in_place.node}
    results, addresses = [], []
    for _ in range(3):
        results.append(float(runner(ids)[0]))
        read = read_variable_op(embedding.handle, tf.float32)
        assert not _copies_on_read(embedding.handle, read)
        addresses.append(np.asarray(read).__array_interface__["data"][0])
        del read  # a read held through the next call would make its update copy
    assert results == losses
    np.testing.assert_array_equal(embedding.numpy(), expected)
    assert addresses[1] == addresses[2]  # updated in place (the first update moves it off `start`'s buffer)
