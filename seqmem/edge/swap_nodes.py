"""Swap backends: the nodes that move a tensor to host memory and back.

- `EmulatedDeviceBackend` (the CPU emulated device): `SerializeTensor` keeps its
  payload outside the bounded BFC arena, i.e. in "host" memory, and
  `ParseTensor` allocates the copy back inside it; `EnsureShape` restores the
  static shape. Works for TensorList variants too.
- `HostDeviceBackend` (a real GPU, or a second logical CPU device standing in
  for one): an Identity placed on the host device and one placed on the compute
  device; TensorFlow inserts the copies between devices.

Both cast a tensor to a compressed dtype and back on the compute device
(`cast_node`).

Every inserted node carries `_grappler_do_not_remove`, so Grappler's dependency
optimizer keeps an Identity pair that would otherwise look redundant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from seqmem.edge.branch_restores import RESTORE_IN_BRANCH
from seqmem.ir.graph import Node, TensorInfo, TensorRef

__all__ = ["EmulatedDeviceBackend", "HostDeviceBackend", "cast_node", "marked_in_branch"]

_KEEP = "_grappler_do_not_remove"


def _type(dtype: str) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(type=tf.as_dtype(dtype).as_datatype_enum)


def _keep() -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(b=True)


def _shape(info: TensorInfo) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(shape=tf.TensorShape(info.shape).as_proto())


def marked_in_branch(node: Node) -> Node:
    """`node` with the attribute by which `seqmem.edge.branch_restores` moves it into a conditional's branches."""
    return dataclasses.replace(node, attrs={**node.attrs, RESTORE_IN_BRANCH: attr_value_pb2.AttrValue(b=True)})


def cast_node(name: str, tensor: TensorRef, source: TensorInfo, target: TensorInfo, control_inputs: Sequence[str],
              device: str) -> Node:
    """A Cast of `tensor` from `source`'s dtype to `target`'s, on `device`, after `control_inputs`."""
    return Node(name, "Cast", (tensor,), control_inputs=tuple(control_inputs), outputs=(target,), device=device,
                attrs={"SrcT": _type(source.dtype), "DstT": _type(target.dtype),
                       "Truncate": attr_value_pb2.AttrValue(b=False), _KEEP: _keep()})


class EmulatedDeviceBackend:
    """Swap through serialized host buffers (see the module docstring)."""

    cast = staticmethod(cast_node)
    in_branch = staticmethod(marked_in_branch)

    def swap_out(self, name: str, tensor: TensorRef, info: TensorInfo, producer: Node) -> Sequence[Node]:
        host = TensorInfo("string", (), None)
        return [Node(name, "SerializeTensor", (tensor,), outputs=(host,), device=producer.device,
                     attrs={"T": _type(info.dtype), _KEEP: _keep()})]

    def swap_in(self, name: str, host: TensorRef, info: TensorInfo, trigger: str, consumer: Node) -> Sequence[Node]:
        parsed = Node(f"{name}/parse", "ParseTensor", (host,), control_inputs=(trigger,), outputs=(info,),
                      device=consumer.device, attrs={"out_type": _type(info.dtype), _KEEP: _keep()})
        restored = Node(name, "EnsureShape", (TensorRef(parsed.name, 0),), outputs=(info,), device=consumer.device,
                        attrs={"T": _type(info.dtype), "shape": _shape(info), _KEEP: _keep()})
        return [parsed, restored]


class HostDeviceBackend:
    """Swap through Identity copies to `host_device` and back to `compute_device`."""

    cast = staticmethod(cast_node)
    in_branch = staticmethod(marked_in_branch)

    def __init__(self, host_device: str = "/device:CPU:0", compute_device: str = "/device:GPU:0") -> None:
        self.host_device = host_device
        self.compute_device = compute_device

    def swap_out(self, name: str, tensor: TensorRef, info: TensorInfo, producer: Node) -> Sequence[Node]:
        return [Node(name, "Identity", (tensor,), outputs=(info,), device=self.host_device,
                     attrs={"T": _type(info.dtype), _KEEP: _keep()})]

    def swap_in(self, name: str, host: TensorRef, info: TensorInfo, trigger: str, consumer: Node) -> Sequence[Node]:
        return [Node(name, "Identity", (host,), control_inputs=(trigger,), outputs=(info,),
                     device=consumer.device or self.compute_device, attrs={"T": _type(info.dtype), _KEEP: _keep()})]
