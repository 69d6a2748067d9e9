"""seqmem.edge.unpacked_splits: four-way splits become unpacks, in the graph and in loop bodies; results
unchanged."""

import numpy as np
import tensorflow as tf

from seqmem.edge.unpacked_splits import unpack_splits
from seqmem.edge.runner import graph_def_runner
from tests.edge.rnn_step import assert_trains_the_same, rnn_step


def _ops(graph_def):
    return [(n.name, n.op) for n in [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]]


def test_the_lstm_cells_split_becomes_an_unpack_and_the_step_trains_the_same(op_determinism):
    function, variables, inputs, _owners = rnn_step()
    graph_def = function.graph.as_graph_def()
    splits = {name for name, op in _ops(graph_def) if op == "Split"}
    assert splits  # the LSTM cell's gates, forward and in the gradient loop's recomputation, if any
    unpacked = unpack_splits(graph_def)
    assert not {name for name, op in _ops(unpacked) if op == "Split"}
    assert splits <= {name for name, op in _ops(unpacked) if op == "Unpack"}  # same names: references hold
    assert {name for name, op in _ops(graph_def) if op == "Split"} == splits  # the input is left as it was
    renamed = [f.signature.name for f in unpacked.library.function if f.signature.name.endswith("_seqmem_unpacked")]
    assert renamed and len(unpacked.library.function) == len(graph_def.library.function)
    assert_trains_the_same(function, variables, inputs, unpacked)


def test_splits_of_any_axis_and_of_one_unknown_size_give_the_same_outputs():
    @tf.function
    def splits(x, y, z):
        return (*tf.split(x, 4, axis=1), *tf.split(x, 4, axis=0), *tf.split(x, 8, axis=-1),
                *tf.split(y, 4, axis=1), *tf.split(z, 4, axis=1))

    # y's split dimension has no known size, z's batch has none
    function = splits.get_concrete_function(tf.TensorSpec([8, 64]), tf.TensorSpec([8, None]),
                                            tf.TensorSpec([None, 64]))
    unpacked = unpack_splits(function.graph.as_graph_def())
    assert sum(op == "Unpack" for _, op in _ops(unpacked)) == 5
    x = tf.random.normal([8, 64], seed=1)
    for expected, got in zip(function(x, x, x), graph_def_runner(function, unpacked)(x, x, x)):
        assert np.array_equal(expected.numpy(), got.numpy())


def test_splits_it_cannot_shape_or_that_allocate_in_order_are_left_as_they_are():
    @tf.function
    def splits(x, y):
        return (*tf.split(x, 2, axis=1), *tf.split(y, 4, axis=1))

    # two ways: allocated in order; y has two sizes unknown
    graph_def = splits.get_concrete_function(tf.TensorSpec([8, 64]), tf.TensorSpec([None, None])).graph.as_graph_def()
    assert unpack_splits(graph_def) is graph_def
