import pytest

from seqmem.runtime.device import run_with_budget


def conv_filter_grad_scratch():
    """Child process: scratch bytes measured for a conv net's Conv2DBackpropFilter nodes."""
    from seqmem.edge import capture
    from seqmem.edge.scratch_probe import measure_scratch_bytes
    from seqmem.examples.steps import build_example

    example = build_example("cnn", 8)
    graph = capture.from_tf(example.step, example.input_specs)
    scratch = measure_scratch_bytes(graph)
    return {graph.node(name).op: size for name, size in scratch.items()}


@pytest.mark.device
def test_probe_measures_conv_backprop_scratch_on_the_emulated_device():
    run = run_with_budget(conv_filter_grad_scratch, budget_mb=1024)
    assert run.ok, run.message
    assert run.value.get("Conv2DBackpropFilter", 0) > 1 << 20


def test_probe_refuses_to_run_without_a_measuring_device():
    import pytest

    from seqmem.edge.scratch_probe import measure_scratch_bytes
    from seqmem.ir.graph import Graph

    with pytest.raises(RuntimeError, match="emulated device"):
        measure_scratch_bytes(Graph([]))
