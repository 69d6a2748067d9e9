"""Tiny hand-built graphs for unit tests (no TensorFlow)."""

import dataclasses

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

    def cast(self, name, tensor, source, target, control_inputs, device):
        return Node(name, "Cast", (tensor,), control_inputs=tuple(control_inputs), outputs=(target,), device=device)

    def in_branch(self, node):
        return dataclasses.replace(node, attrs={**node.attrs, "in_branch": True})


def loop_training_graph(iterations=10, element_bytes=1 << 20):
    """x -> forward While (state h, and a list saving one element per iteration) -> head -> loss;
    gradient_tape/head_grad reads h, gradient_tape/while_grad pops the list; update reads its result.

    Returns the graph and the list's `LoopSwap` (accumulator `acc`, the list at `fwd:1`).
    """
    g, swaps = loop_lists_training_graph(iterations, (element_bytes,))
    return g, swaps[0]


def loop_lists_training_graph(iterations=10, list_element_bytes=(1 << 20,), buffers=None):
    """loop_training_graph with one list per entry of `list_element_bytes` (element bytes each), list i
    at `fwd:i+1`, accumulators `acc`, `acc1`, `acc2`, ...; `buffers`: each list's `LoopSwap.buffer`
    (default: unknown). Returns the graph and the lists' `LoopSwap`s."""
    from seqmem.decisions.plan import LoopSwap

    variant = lambda size: TensorInfo("variant", (), size)  # noqa: E731
    accumulators = ["acc" if i == 0 else f"acc{i}" for i in range(len(list_element_bytes))]
    lists = [f"fwd:{i + 1}" for i in range(len(list_element_bytes))]
    h_bytes = max(list_element_bytes)
    g = graph(
        node("x", "Placeholder", outputs=(1024,)),
        *[node(name, "EmptyTensorList", outputs=(variant(0),)) for name in accumulators],
        node("fwd", "While", ["x", *accumulators],
             outputs=(h_bytes, *[variant(iterations * size) for size in list_element_bytes])),
        node("head", "Op", ["fwd:0"], outputs=(h_bytes,)),
        node("loss", "Sum", ["head"], outputs=(TensorInfo("float32", (), 4),)),
        node("ones", "Const", outputs=(4,)),
        node("gradient_tape/head_grad", "Op", ["ones", "fwd:0"], outputs=(h_bytes,)),
        node("gradient_tape/while_grad", "While", ["gradient_tape/head_grad", *lists],
             outputs=(1024, *[variant(0) for _ in lists])),
        node("update", "AssignSub", ["gradient_tape/while_grad:0"], outputs=()),
    )
    buffers = buffers or [None] * len(list_element_bytes)
    swaps = tuple(LoopSwap(name, "fwd", i + 1, "gradient_tape/while_grad", i + 1, "float32", (size // 4,), size,
                           buffer)
                  for i, (name, size, buffer) in enumerate(zip(accumulators, list_element_bytes, buffers)))
    return g, swaps
