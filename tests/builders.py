"""Tiny hand-built graphs for unit tests (no TensorFlow)."""

from seqmem.ir.graph import Graph, Node, TensorInfo, TensorRef


def tensor(size_bytes, shape=None, dtype="float32"):
    return TensorInfo(dtype=dtype, shape=shape if shape is not None else (size_bytes // 4,), size_bytes=size_bytes)


def node(name, op="Op", inputs=(), outputs=(4,), control=(), **fields):
    """A node reading `inputs` ("a" or "a:1") with outputs of the given byte sizes."""
    return Node(
        name=name,
        op=op,
        inputs=tuple(TensorRef.parse(i) for i in inputs),
        control_inputs=tuple(control),
        outputs=tuple(size if isinstance(size, TensorInfo) else tensor(size) for size in outputs),
        **fields,
    )


def graph(*nodes, outputs=()):
    return Graph(nodes, outputs=[TensorRef.parse(o) for o in outputs])


def training_graph():
    """x -> f1 -> f2 -> loss; gradient_tape/g2 reads f2, gradient_tape/g1 reads f1; update reads g1.

    Sizes: x 100 B (input), w 40 B (constant), f1 1000 B, f2 2000 B, loss 4 B,
    seed 4 B, g2 2000 B, g1 1000 B, update 0 outputs.
    """
    return graph(
        node("x", "Placeholder", outputs=(100,)),
        # ops are named "Op" where the simulator's in-place rule would blur the hand count
        node("w", "Const", outputs=(40,)),
        node("f1", "MatMul", ["x", "w"], outputs=(1000,)),
        node("f2", "Op", ["f1"], outputs=(2000,)),
        node("loss", "Sum", ["f2"], outputs=(TensorInfo("float32", (), 4),)),
        node("ones", "Const", outputs=(4,)),
        node("gradient_tape/g2", "Op", ["ones", "f2"], outputs=(2000,)),
        node("gradient_tape/g1", "Op", ["gradient_tape/g2", "f1"], outputs=(1000,)),
        node("update", "AssignSub", ["gradient_tape/g1"], outputs=()),
    )


class IdentityBackend:
    """Plain IR nodes standing in for the TF swap backends."""

    def swap_out(self, name, tensor, info, producer):
        return [Node(name, "HostCopy", (tensor,), outputs=(info,))]

    def swap_in(self, name, host, info, trigger, consumer):
        return [Node(name, "DeviceCopy", (host,), control_inputs=(trigger,), outputs=(info,))]
