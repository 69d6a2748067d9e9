"""seqmem.edge.collectives: a step's collectives found, and its all-reduces and all-gathers made local."""

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from seqmem.edge.collectives import collective_ops, local_graph_def


def _all_reduce_graph() -> graph_pb2.GraphDef:
    """x -> CollectiveReduceV2 (group size, keys) -> y = 2 * reduced, in the graph and in a library function."""

    @tf.function
    def step(x):
        reduced = tf.raw_ops.CollectiveReduceV2(
            input=x, group_size=tf.constant(2), group_key=tf.constant(1), instance_key=tf.constant(1),
            ordering_token=[], merge_op="Add", final_op="Id")
        return 2.0 * reduced

    return step.get_concrete_function(tf.TensorSpec([3], tf.float32)).graph.as_graph_def()


def test_each_all_reduce_becomes_the_identity_of_its_input():
    graph_def = _all_reduce_graph()
    (name,) = collective_ops(graph_def)
    local = local_graph_def(graph_def)
    node = next(node for node in local.node if node.name == name)
    original = next(node for node in graph_def.node if node.name == name)
    assert node.op == "Identity" and list(node.attr) == ["T"]
    assert list(node.input) == [original.input[0]]
    assert collective_ops(local) == [] and collective_ops(graph_def) == [name]  # the original is untouched


def test_the_local_graph_runs_alone_and_computes_with_the_local_value():
    local = local_graph_def(_all_reduce_graph())
    run = tf.compat.v1.wrap_function(
        lambda x: tf.graph_util.import_graph_def(local, input_map={"x:0": x}, return_elements=["Identity:0"]),
        [tf.TensorSpec([3], tf.float32)])
    np.testing.assert_array_equal(run(tf.constant([1.0, 2.0, 3.0]))[0].numpy(), [2.0, 4.0, 6.0])


def test_all_reduces_in_library_functions_are_made_local_too():
    graph_def = graph_pb2.GraphDef()
    body = graph_def.library.function.add()
    body.signature.name = "replica_step"
    body.node_def.add(name="all_reduce", op="CollectiveReduceV2",
                      input=["grad:output:0", "size:output:0", "key:output:0", "key:output:0", "^before"])
    body.node_def.add(name="scaled", op="Mul", input=["all_reduce:data:0", "scale"])
    body.ret["reduced"] = "all_reduce:data:0"
    local = local_graph_def(graph_def)
    (function,) = local.library.function
    node, scaled = function.node_def
    assert node.op == "Identity" and list(node.input) == ["grad:output:0", "^before"]
    # read by the name of the stand-in's output
    assert list(scaled.input) == ["all_reduce:output:0", "scale"] and function.ret["reduced"] == "all_reduce:output:0"
    # the original is in TensorFlow's runtime under its name: the edited body is a copy under another
    assert function.signature.name.startswith("replica_step_seqmem_local_")


def _all_gather_graph() -> graph_pb2.GraphDef:
    """x -> CollectiveGatherV2 of a group of 2 -> y = 2 * gathered."""

    @tf.function
    def step(x):
        gathered = tf.raw_ops.CollectiveGatherV2(
            input=x, group_size=tf.constant(2), group_key=tf.constant(1), instance_key=tf.constant(1),
            ordering_token=[])
        return 2.0 * gathered

    return step.get_concrete_function(tf.TensorSpec([3, 2], tf.float32)).graph.as_graph_def()


def test_an_all_gather_becomes_its_input_concatenated_once_per_worker():
    local = local_graph_def(_all_gather_graph())
    assert collective_ops(local) == []
    run = tf.compat.v1.wrap_function(
        lambda x: tf.graph_util.import_graph_def(local, input_map={"x:0": x}, return_elements=["Identity:0"]),
        [tf.TensorSpec([3, 2], tf.float32)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(run(tf.constant(x))[0].numpy(), 2 * np.concatenate([x, x]))


def test_a_graph_with_a_collective_that_has_no_local_stand_in_is_not_made_local():
    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="sent", op="CollectiveBcastSendV2")
    assert local_graph_def(graph_def) is None
    unknown_group = graph_pb2.GraphDef()
    unknown_group.node.add(name="size", op="Placeholder")
    unknown_group.node.add(name="gathered", op="CollectiveGatherV2", input=["x", "size", "key", "key"])
    assert local_graph_def(unknown_group) is None
    assert local_graph_def(graph_pb2.GraphDef()) == graph_pb2.GraphDef()
