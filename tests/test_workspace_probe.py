from seqmem.device import run_with_budget


def conv_filter_grad_scratch():
    """Child process: scratch bytes measured for a conv net's Conv2DBackpropFilter nodes."""
    from seqmem import capture
    from seqmem.examples import build_example
    from seqmem.workspace_probe import measure_workspaces

    example = build_example("cnn", 8)
    graph = capture.from_tf(example.step, example.input_specs)
    scratch = measure_workspaces(graph)
    return {graph.node(name).op: size for name, size in scratch.items()}


def test_probe_measures_conv_backprop_scratch_on_the_emulated_device():
    run = run_with_budget(conv_filter_grad_scratch, budget_mb=1024)
    assert run.ok, run.message
    assert run.value.get("Conv2DBackpropFilter", 0) > 1 << 20


def test_probe_refuses_to_run_without_a_measuring_device():
    import pytest

    from seqmem.graph import Graph
    from seqmem.workspace_probe import measure_workspaces

    with pytest.raises(RuntimeError, match="emulated device"):
        measure_workspaces(Graph([]))
