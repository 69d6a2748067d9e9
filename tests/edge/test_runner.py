import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context

from seqmem.edge import runner


def _memory_optimization() -> int:
    serialized = context.context().function_call_options.config_proto_serialized
    return config_pb2.ConfigProto.FromString(serialized).graph_options.rewrite_options.memory_optimization


def test_a_rewritten_graph_runs_without_grapplers_memory_optimizer_and_the_thread_keeps_its_options():
    before = context.context().function_call_options.config_proto_serialized
    with runner._function_options_without_memory_optimizer():
        assert _memory_optimization() == rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    assert context.context().function_call_options.config_proto_serialized == before


def test_the_runner_computes_what_the_function_computes():
    function = tf.function(lambda x: tf.add_n([x, 2 * x, 3 * x])).get_concrete_function(tf.TensorSpec([3]))
    x = tf.constant([1.0, 2.0, 3.0])
    (got,) = runner.graph_def_runner(function, function.graph.as_graph_def())(x)
    np.testing.assert_array_equal(got.numpy(), function(x).numpy())
    assert _memory_optimization() != rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
