"""Measured scratch memory: run single ops on the measuring device and read the peak.

Kernels allocate temporaries (im2col buffers, transposed copies) that no graph
shows. On a measuring device (a GPU or the emulated device) seqmem runs each
distinct large op of a graph once in isolation, its inputs made by Fill ops in
the same graph (constant inputs such as shapes copied as they are), then

    scratch = peak during the run - bytes live before it - input bytes - output bytes

An input the size of an output is kept alive past the op, so that the op
cannot write that output into it (the simulator gives such outputs buffers of
their own). Ops with the same type, attributes, input shapes and constant
inputs share one measurement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

from seqmem.edge import capture
from seqmem.ir.graph import Graph, Node
from seqmem.ir.op_tables import FUNCTIONAL_OPS, INPLACE_OPS, VIEW_OPS
from seqmem.runtime import device, stall_watch

__all__ = ["measure_scratch_bytes"]

_log = logging.getLogger(__name__)
_MIN_TENSOR_BYTES = 256 << 10
_WARM_ARENA_BYTES = 256 << 20
# The least arena a fresh process probes in. A kernel's scratch is the kernel's, not the arena's; in an arena
# not much larger than a probe's buffers, BFC hands a temporary a whole free chunk less than twice its size,
# and the probe would count that chunk, not what the kernel asked for. The simulator's allocator model rounds
# to chunks for the step's own arena.
_PROBE_ARENA_MB = 1024


def measure_scratch_bytes(graph: Graph, names: Iterable[str] | None = None, *, fresh_process: bool = True
                          ) -> dict[str, int]:
    """Scratch bytes of each probed node of `graph`, by node name (nodes without scratch are left out).

    names: the nodes to consider (default: all). Only stateless ops that touch a
    tensor of at least 256 KiB are probed. fresh_process: on the emulated
    device, run the probes in a fresh process whose arena holds nothing else
    (chunks left free by earlier work would otherwise be handed out whole and
    inflate the figures), of the budget's size or `_PROBE_ARENA_MB`, whichever
    is larger; False probes in this process.
    Needs a measuring device; raises RuntimeError otherwise.
    """
    device.memory_stats()  # raises when there is nothing to measure
    budget_mb = device.emulated_budget_mb()
    names = list(names) if names is not None else None
    if budget_mb is None or not fresh_process:
        return _measure_here(graph, names)
    run = device.run_with_budget(_measure_here, graph, names, budget_mb=max(budget_mb, _PROBE_ARENA_MB))
    if not run.ok:
        raise RuntimeError(f"measuring scratch memory failed ({run.verdict}): {run.message}")
    return run.value


def _measure_here(graph: Graph, names: list[str] | None) -> dict[str, int]:
    graph_def = capture.to_graph_def(graph)
    node_defs = {n.name: n for n in graph_def.node}
    probes: dict[bytes, tuple[Node, graph_pb2.GraphDef]] = {}
    signature_of: dict[str, bytes] = {}
    for name in names if names is not None else graph.nodes:
        node = graph.node(name)
        if not _worth_probing(graph, node):
            continue
        probe = _probe_graph(graph, node, node_defs)
        if probe is None:
            continue
        signature = probe.SerializeToString(deterministic=True)
        probes.setdefault(signature, (node, probe))
        signature_of[name] = signature
    _warm_arena()
    scratch = _run_probes(graph, list(probes.items()))
    return {name: scratch[signature] for name, signature in signature_of.items() if scratch.get(signature, 0) > 0}


def _worth_probing(graph: Graph, node: Node) -> bool:
    if node.op in VIEW_OPS or node.op in INPLACE_OPS or node.op in FUNCTIONAL_OPS or node.persistent:
        return False
    if node.control_inputs and not node.outputs:
        return False
    sizes = [graph.tensor(ref).size_bytes for ref in node.inputs] + [o.size_bytes for o in node.outputs]
    if any(size is None for size in sizes) or any(graph.tensor(r).dtype in ("resource", "variant") for r in node.inputs):
        return False
    return max(sizes, default=0) >= _MIN_TENSOR_BYTES


def _probe_graph(graph: Graph, node: Node, node_defs: Mapping) -> graph_pb2.GraphDef | None:
    """A GraphDef of placeholders (or copied constants) feeding a copy of `node`."""
    probe = graph_pb2.GraphDef()
    target = probe.node.add()
    target.CopyFrom(node_defs[node.name])
    target.name = "probe"
    target.ClearField("device")
    del target.input[:]
    output_sizes = {info.size_bytes for info in node.outputs}
    for i, ref in enumerate(node.inputs):
        producer = node_defs[ref.node]
        source = probe.node.add()
        shape_value = _static_shape_value(graph, ref)
        if shape_value is not None:
            _const(source, f"input_{i}", shape_value)
        elif producer.op == "Const":
            source.CopyFrom(producer)
            source.ClearField("device")
            source.name = f"input_{i}"
        else:
            _zeros(probe, source, f"input_{i}", graph.tensor(ref))
            if graph.tensor(ref).size_bytes in output_sizes:
                _keep_after_probe(probe, source.name, graph.tensor(ref))
        target.input.append(source.name)
    return probe


def _keep_after_probe(probe: graph_pb2.GraphDef, name: str, info) -> None:
    """Read input `name` (the size of an output) once more after the probed op, by a `Shape` that waits for
    it, so the op cannot write that output into the input's buffer: the simulator gives every output of an
    op it does not list as in-place a buffer of its own (an op that wrote its output into its input would
    leave its temporaries room there, and they would measure as no scratch). Inputs of other sizes stay
    free, as a kernel's temporaries may take them where the op is their last reader."""
    keep = probe.node.add()
    keep.name, keep.op = f"{name}/kept", "Shape"
    keep.input.extend([name, "^probe"])
    keep.attr["T"].type = tf.as_dtype(info.dtype).as_datatype_enum
    keep.attr["out_type"].type = tf.int32.as_datatype_enum


def _static_shape_value(graph: Graph, ref) -> np.ndarray | None:
    """The value of a Shape/ShapeN output whose argument has a fully known static shape."""
    producer = graph.node(ref.node)
    if producer.op not in ("Shape", "ShapeN"):
        return None
    argument = producer.inputs[ref.index if producer.op == "ShapeN" else 0]
    shape = graph.tensor(argument).shape
    if shape is None or any(d is None for d in shape):
        return None
    return np.array(shape, dtype=tf.as_dtype(graph.tensor(ref).dtype).as_numpy_dtype)


def _const(node, name: str, value: np.ndarray) -> None:
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))


def _zeros(probe: graph_pb2.GraphDef, fill, name: str, info) -> None:
    """Make `fill` a Fill node producing zeros like `info`, so the input lives in the arena."""
    dtype = tf.as_dtype(info.dtype)
    for suffix, value in (("dims", np.array(info.shape, np.int32)), ("value", np.zeros((), dtype.as_numpy_dtype))):
        _const(probe.node.add(), f"{name}/{suffix}", value)
    fill.name, fill.op = name, "Fill"
    fill.input.extend([f"{name}/dims", f"{name}/value"])
    fill.attr["T"].type = dtype.as_datatype_enum
    fill.attr["index_type"].type = tf.int32.as_datatype_enum


def _run_probes(graph: Graph, probes: list[tuple[bytes, tuple[Node, graph_pb2.GraphDef]]]) -> dict[bytes, int]:
    """Scratch bytes of each probe, keyed by its signature; all probes in one graph and one
    session (creating a session per probe cost most of the time), each run on its own."""
    tf_graph = tf.Graph()
    fetches = {}
    with tf_graph.as_default():
        for number, (signature, (node, probe)) in enumerate(probes):
            scope = f"probe_{number}"
            try:
                tf.graph_util.import_graph_def(probe, name=scope)
            except (ValueError, TypeError) as error:
                _log.debug("could not import the probe of %s (%s): %s", node.name, node.op, error)
                continue
            op = tf_graph.get_operation_by_name(f"{scope}/probe")
            input_bytes = sum(graph.tensor(ref).size_bytes for ref, t in zip(node.inputs, op.inputs)
                              if t.op.type == "Fill")
            run = op.outputs + [tf_graph.get_tensor_by_name(f"{scope}/{n.name}:0") for n in probe.node
                                if n.name.endswith("/kept")]
            fetches[signature] = (node, run, input_bytes + sum(info.size_bytes or 0 for info in node.outputs))
    config = tf.compat.v1.ConfigProto(
        # one op at a time, as on one compute stream: with the session's default threads, the Fill ops that
        # make the probe's inputs could overlap its op, and its scratch would differ from run to run
        inter_op_parallelism_threads=1, use_per_session_threads=True,
        graph_options=tf.compat.v1.GraphOptions(
            # no constant folding: the probe's inputs are constants, the op must still run
            optimizer_options=tf.compat.v1.OptimizerOptions(opt_level=tf.compat.v1.OptimizerOptions.L0),
            rewrite_options=rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)))
    result = {}
    with tf.compat.v1.Session(graph=tf_graph, config=config) as session:
        for signature, (node, run, in_out_bytes) in fetches.items():
            try:
                session.run(run)  # first run: kernel creation, lazy allocations
                device.reset_peak()
                before = device.memory_stats().current_bytes
                session.run(run)
                peak = device.memory_stats().peak_bytes
            except tf.errors.OpError as error:
                _log.debug("could not probe %s (%s): %s", node.name, node.op, error)
                continue
            result[signature] = max(0, peak - before - in_out_bytes)
    return result


def _warm_arena() -> None:
    """Give the arena one large free region, so that no probe sees region growth or a chunk handed out whole:
    the BFC allocator splits a free chunk only when it is at least twice the request, so a temporary placed
    in what a smaller region had left beside the probe's inputs would count that whole remainder. On the
    emulated device the region is all the arena has left (its budget less 8 MiB is
    asked for, then halves); elsewhere 256 MiB. A failed allocation costs seconds (the allocator waits and
    retries), so sizes start within the arena."""
    if device.arena_reserved():
        return  # one free region already
    budget_mb = device.emulated_budget_mb()
    sizes = [_WARM_ARENA_BYTES] if budget_mb is None else \
        [(budget_mb - 8) << 20] + [(budget_mb << 20) >> halvings for halvings in range(1, 11)]
    for size in (size for size in sizes if size >= 1 << 20):
        try:
            with stall_watch.expected_idle():  # a size that does not fit waits in the allocator's retry
                block = tf.raw_ops.Empty(shape=[size >> 20, 1 << 20], dtype=tf.uint8)  # allocated, not written
            del block
            return
        except tf.errors.ResourceExhaustedError:
            continue
    _log.debug("arena too small to pre-warm; scratch measurements may include region growth")
