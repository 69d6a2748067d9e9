import pytest

from seqmem.runtime.device import run_with_budget


def cnn_scratch():
    """Child process: (op, scratch bytes measured, its inputs' bytes) of each node of the cnn example's step
    (batch 8) that has scratch."""
    from seqmem.edge import capture
    from seqmem.edge.scratch_probe import measure_scratch_bytes
    from seqmem.examples.steps import build_example

    example = build_example("cnn", 8)
    graph = capture.from_tf(example.step, example.input_specs)
    scratch = measure_scratch_bytes(graph)
    return [(graph.node(name).op, size, [graph.tensor(ref).size_bytes for ref in graph.node(name).inputs])
            for name, size in scratch.items()]


@pytest.mark.device
def test_probe_measures_kernel_temporaries_on_the_emulated_device():
    run = run_with_budget(cnn_scratch, budget_mb=1024)
    assert run.ok, run.message
    by_op = {}
    for op, size, input_bytes in run.value:
        by_op.setdefault(op, []).append((size, input_bytes))
    assert max(size for size, _ in by_op["Conv2DBackpropFilter"]) > 1 << 20
    # MaxPoolGrad's int64 argmax, twice the bytes of the pooled output (its second input): measured although
    # the kernel would write its output into its first input's buffer were that free (the probe keeps it)
    largest = max(by_op["MaxPoolGrad"], key=lambda item: item[1][0])
    assert largest[0] >= 2 * largest[1][1]


def test_probe_refuses_to_run_without_a_measuring_device():
    import pytest

    from seqmem.edge.scratch_probe import measure_scratch_bytes
    from seqmem.ir.graph import Graph

    with pytest.raises(RuntimeError, match="emulated device"):
        measure_scratch_bytes(Graph([]))
