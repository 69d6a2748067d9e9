import pytest

from seqmem.analyze.anatomy import analyze_step
from seqmem.errors import GraphError, NoBackwardPassError
from seqmem.ir.graph import TensorInfo, TensorRef
from tests.builders import graph, node, training_graph


def test_finds_loss_forward_backward_and_feature_maps():
    anatomy = analyze_step(training_graph())
    assert anatomy.losses == (TensorRef("loss"),)
    assert anatomy.forward == {"x", "w", "f1", "f2", "loss"}
    assert anatomy.backward == {"ones", "gradient_tape/g2", "gradient_tape/g1", "update"}  # from the seed on
    # x is an input (persistent): not a feature map; f1 and f2 are.
    assert anatomy.feature_maps == (TensorRef("f1"), TensorRef("f2"))


def test_loss_from_tf1_seed_fill_of_shape():
    scalar = TensorInfo("float32", (), 4)
    g = graph(
        node("x", "Placeholder", outputs=(16,)),
        node("h", "Op", ["x"], outputs=(16,)),
        node("aux", "Sum", ["x"], outputs=(scalar,)),
        node("loss", "Sum", ["h"], outputs=(scalar,)),
        node("gradients/Shape", "Shape", ["loss"], outputs=(0,)),
        node("gradients/grad_ys_0", "Fill", ["gradients/Shape"], outputs=(scalar,)),
        node("gradients/g", "Op", ["gradients/grad_ys_0", "h"], outputs=(16,)),
    )
    assert analyze_step(g).losses == (TensorRef("loss"),)


def test_loss_override_and_bad_override():
    g = training_graph()
    assert analyze_step(g, loss="f2:0").forward == {"x", "w", "f1", "f2"}
    with pytest.raises(GraphError, match="loss='nope'"):
        analyze_step(g, loss="nope")
    several = analyze_step(g, loss=["f1", "f2:0", "f1:0"])  # several losses, each named once
    assert several.losses == (TensorRef("f1"), TensorRef("f2")) and several.forward == {"x", "w", "f1", "f2"}
    with pytest.raises(GraphError, match="names no tensor"):
        analyze_step(g, loss=[])


def test_no_backward_pass_says_so_and_mentions_loss():
    g = graph(node("x", "Placeholder"), node("y", "Op", ["x"]))
    with pytest.raises(NoBackwardPassError, match="loss="):
        analyze_step(g)


def test_what_only_the_update_computes_from_the_data_does_not_hide_the_loss(caplog):
    """A sparse optimizer reads the unique indices of each embedding lookup, computed from the data but by no
    forward scalar; the seed's reader names no op (TensorFlow's tape puts a root-scope loss's gradient at
    `gradient_tape/`), so the loss is the scalar covering what the backward pass reads of the forward one."""
    scalar = TensorInfo("float32", (), 4)
    ids = [node(f"Adagrad/Unique_{i}", "Unique", ["ids"], outputs=(TensorInfo("int32", (4,), 16),)) for i in range(4)]
    g = graph(
        node("x", "Placeholder", outputs=(16,)),
        node("ids", "Placeholder", outputs=(TensorInfo("int32", (4,), 16),)),
        node("h1", "Op", ["x", "ids"], outputs=(16,)),
        node("h2", "Op", ["h1"], outputs=(16,)),
        node("Mean_1", "Mean", ["h2"], outputs=(scalar,)),
        node("ones", "Const", outputs=(scalar,)),
        node("gradient_tape/Reshape", "Reshape", ["ones"], outputs=(16,)),
        node("gradient_tape/g2", "Op", ["gradient_tape/Reshape", "h2"], outputs=(16,)),
        node("gradient_tape/g1", "Op", ["gradient_tape/g2", "h1"], outputs=(16,)),
        *ids,
        *[node(f"Adagrad/update_{i}", "SparseApply", ["gradient_tape/g1", f"Adagrad/Unique_{i}"], outputs=())
          for i in range(4)],
    )
    with caplog.at_level("WARNING"):
        assert analyze_step(g).losses == (TensorRef("Mean_1"),)
    assert "could not be told apart" not in caplog.text
