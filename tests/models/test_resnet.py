"""models/resnet: builders, the image-folder loader, and the benchmark's command line."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from models.resnet import benchmark
from models.resnet.data import image_folder, synthetic_batch
from models.resnet.model import ResidualBlock, resnet


def _weight_layers(model):
    """Convolutions on the main path plus the classifier (projection shortcuts are not counted)."""
    layers = [m for m in model.submodules if isinstance(m, (tf.keras.layers.Conv2D, tf.keras.layers.Dense))]
    return sum(1 for layer in layers if layer.name != "shortcut")


@pytest.mark.parametrize("depth, image_size", [(50, 224), (101, 64), (164, 32)])
def test_depth_counts_weight_layers(depth, image_size):
    assert _weight_layers(resnet(depth, image_size)) == depth


def test_resnet50_has_the_documented_parameter_count():
    model = resnet(50, 224, classes=1000)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert trainable == 25_557_032  # torchvision's resnet50 has the same
    assert round(model.count_params() / 1e6, 1) == 25.6  # with batch norm's moving statistics
    assert model.output_shape == (None, 1000)


@pytest.mark.parametrize("depth", [0, 34, 12, 2])
def test_bad_depth_is_refused(depth):
    with pytest.raises(ValueError, match="9n \\+ 2"):
        resnet(depth)


def test_recomputed_blocks_give_the_same_loss_and_gradients():
    images, labels = synthetic_batch(4, 16, 10)
    results = []
    for recompute in (False, True):
        tf.keras.utils.set_random_seed(0)
        model = resnet(11, 16, 10, recompute=recompute)
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        results.append((loss, tape.gradient(loss, model.trainable_variables)))
    (loss, grads), (loss_r, grads_r) = results
    assert sum(isinstance(m, ResidualBlock) and m.recompute for m in model.submodules) == 3
    np.testing.assert_allclose(loss_r, loss, rtol=1e-6)
    for g, g_r in zip(grads, grads_r):
        np.testing.assert_allclose(g_r, g, rtol=1e-4, atol=1e-6)  # same ops, recomputed: float reassociation only


def _write_images(root, counts):
    for name, count in counts.items():
        os.makedirs(root / name, exist_ok=True)
        for i in range(count):
            pixels = np.full((20 + i, 30, 3), 40 * i, np.uint8)
            (root / name / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    (root / "cats" / "notes.txt").write_text("not an image")


def test_image_folder_loads_classes_and_images(tmp_path):
    _write_images(tmp_path, {"cats": 3, "dogs": 2})
    dataset, classes = image_folder(str(tmp_path), image_size=8, batch=2, shuffle_seed=None)
    assert classes == ["cats", "dogs"]
    batches = list(dataset)
    assert [b[0].shape.as_list() for b in batches] == [[2, 8, 8, 3], [2, 8, 8, 3], [1, 8, 8, 3]]
    labels = np.concatenate([b[1].numpy() for b in batches])
    assert labels.tolist() == [0, 0, 0, 1, 1]
    assert 0.0 <= float(tf.reduce_min(batches[0][0])) and float(tf.reduce_max(batches[0][0])) <= 1.0
    shuffled, _ = image_folder(str(tmp_path), image_size=8, batch=5, shuffle_seed=1)
    assert sorted(next(iter(shuffled))[1].numpy().tolist()) == [0, 0, 0, 1, 1]


def test_image_folder_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_folder(str(tmp_path / "missing"), 8, 2)
    with pytest.raises(ValueError, match="no class subfolders"):
        image_folder(str(tmp_path), 8, 2)
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="no image files"):
        image_folder(str(tmp_path), 8, 2)


@pytest.mark.parametrize("argv", [["--depth", "12"], ["--budget-mb", "0"], ["--depths", "101,x"],
                                  ["--precision", "1.5"], ["--runs", "0"], ["--variants", "seqmem,fold"],
                                  ["--variants", ","], ["--host-memory-mb", "0"], ["--host-memory-mb", "inf"],
                                  ["--host-memory-mb", "nan"], ["--at-batch", "0"],
                                  ["--variants", "baseline"], ["--frobnicate"]])
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_benchmark_searches_each_variant_from_the_bound_and_reports_table_a(tmp_path, monkeypatch, capsys):
    # the searches themselves (real OOM in fresh processes) run in the demo's test; here, what the benchmark
    # asks of them: the graph bound first, the baseline from its predicted batch, each variant from B_base
    from seqmem.bench.batch_search import BatchSearch
    from seqmem.runtime.device import BudgetRun

    calls, searches = [], []

    def fake_run_with_budget(function, *args, budget_mb, timeout_s, one_stream):
        calls.append((function.__name__, budget_mb))
        return BudgetRun("ok", value={"predicted_base_batch": 40, "batch": 300, "op": "Conv2D 'c'"})

    def fake_largest_batch(probe, workload, *, budget_mb, limit, start, **settings):
        searches.append((workload.optimized, start, limit))
        return BatchSearch(96 if workload.optimized else 48)

    monkeypatch.setattr(benchmark, "run_with_budget", fake_run_with_budget)
    monkeypatch.setattr(benchmark, "largest_batch", fake_largest_batch)
    argv = ["--tables", "a", "--variants", "seqmem", "--depth", "20", "--image-size", "32", "--classes", "10",
            "--budget-mb", "256", "--max-batch", "96", "--precision", "0.5", "--runs", "1", "--batches-only",
            "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    assert calls == [("batch_bounds", 256)]
    assert searches == [(False, 40, 96), (True, 48, 96)]  # the baseline, then seqmem
    report = json.loads((tmp_path / "resnet-benchmark.json").read_text())
    table_a = report["table_a"]
    assert table_a["baseline"]["batch"] == 48 and table_a["seqmem"]["batch"] == 96 and table_a["limit"]["batch"] == 300
    assert report["at_base"] == {} and not (tmp_path / "resnet-memory.png").exists()
    printed = capsys.readouterr().out
    assert "Table 1(a)" in printed and "| seqmem | 96 | 2.00x |" in printed


def test_report_of_table_a_lists_every_searched_variant():
    args = {"depth": 50, "image_size": 64, "classes": 1000, "budget_mb": 1024, "runs": 3, "precision": 0.03,
            "executor": "one-stream"}
    table_a = {"limit": {"batch": 400, "op": "Conv2DBackpropInput 'x'"}, "baseline": {"batch": 50, "notes": []},
               "seqmem": {"batch": 200, "notes": []}, "seqmem-fp16": {"batch": 300, "notes": ["probe 310: oom"]}}
    printed = benchmark.format_report({"args": args, "table_a": table_a, "at_base": {}, "at_opt": {}, "table_b": []})
    assert "| baseline (B_base) | 50 | 1.00x | 0.12x |" in printed
    assert "| seqmem | 200 | 4.00x | 0.50x |" in printed and "| seqmem-fp16 | 300 | 6.00x | 0.75x |" in printed
    assert "seqmem-lossless" not in printed and "note (seqmem-fp16): probe 310: oom" in printed


def test_report_measures_every_kind_at_a_common_batch():
    args = {"depth": 20, "image_size": 32, "classes": 10, "budget_mb": 256, "runs": 1, "precision": 0.1}
    measured = {"peak_bytes": 200 << 20, "predicted_peak_bytes": 190 << 20, "swaps": 12, "images_per_s": 50.0}
    report = {"args": args, "table_a": {"limit": {"batch": 300}, "baseline": {"batch": 44}, "seqmem": {"batch": 150},
                                        "seqmem-fp16": {"batch": 132}},
              "at_base": {"baseline": {**measured, "swaps": 0, "images_per_s": 100.0}}, "at_opt": {},
              "at_common": {"batch": 132, "rows": {"seqmem": measured, "seqmem-fp16": {"error": "oom", "message": ""}}},
              "table_b": []}
    printed = benchmark.format_report(report)
    assert "emulated device 256 MB (largest batch" in printed
    assert "At batch 132, the largest every seqmem variant trains" in printed
    assert "| seqmem | 200 | 190 | 12 | 50.0 | 0.50x |" in printed and "| seqmem-fp16 | oom | - | - | - | - |" in printed
    report["args"]["host_memory_mb"] = 512.0
    assert "emulated device 256 MB, swaps within 512 MB of host memory (largest batch" in benchmark.format_report(report)


def test_report_at_one_batch_shows_each_run_with_the_time_optimize_took():
    args = {"depth": 50, "image_size": 64, "classes": 1000, "budget_mb": 1024, "at_batch": 654}
    trained = {"peak_bytes": 1000 << 20, "predicted_peak_bytes": 990 << 20, "swaps": 120, "images_per_s": 9.5,
               "build_s": 412.3}
    report = {"args": args, "table_a": {}, "at_base": {}, "at_opt": {}, "table_b": [],
              "at_batch": {"baseline": [{"error": "oom", "message": ""}], "seqmem": [trained, {"error": "oom"}]}}
    lines = benchmark.format_report(report).splitlines()
    assert lines[0].startswith("ResNet-50, 64x64, 1000 classes, batch 654, emulated device 1024 MB")
    assert "| baseline | 1 | oom:  | - | - | - | - |" in lines
    assert "| seqmem | 1 | 1000.0 | 990.0 | 120 | 412 | 9.5 |" in lines and "| seqmem | 2 | oom:  | - | - | - | - |" in lines
    report["at_batch"] = {"seqmem": [{"error": "error", "message": "Traceback\nInfeasibleBudgetError: floor"}]}
    assert "| seqmem | 1 | error: InfeasibleBudgetError: floor | - | - | - | - |" in benchmark.format_report(report)


def test_every_workload_carries_the_host_memory_limit_for_optimize():
    for variant in benchmark.VARIANTS:
        workload = benchmark.workload(variant, 20, 32, 10, 256, host_memory_mb=512.0)
        assert workload.optimized == (variant in benchmark.SEQMEM_KINDS) and workload.host_memory_mb == 512.0


def test_compression_run_reports_final_loss_and_refuses_bad_flags(capsys):
    from models.resnet import compression

    assert compression.final_loss([4.0] * 90 + [1.0] * 10) == 1.0 and compression.final_loss([3.0]) == 3.0
    row = compression.format_row("float16", {"losses": [2.0, 1.0], "accuracy": 0.5, "kinds": ["compress"]})
    assert row == "| float16 | compress | 1 | 0.500 |"
    assert compression.format_row("bfloat16", {"error": "oom"}) == "| bfloat16 | oom | - | - |"
    for argv in (["--depth", "12"], ["--steps", "0"], ["--frobnicate"]):
        with pytest.raises(SystemExit) as exit_info:
            compression.main(argv)
        assert exit_info.value.code == 2 and "usage:" in capsys.readouterr().err


def test_report_with_table_b_only():
    row = {"depth": 1001, "baseline": {"error": "oom", "message": ""},
           "seqmem": {"peak_bytes": 1400 << 20, "predicted_peak_bytes": 1200 << 20, "swaps": 157},
           "smallest": {"peak_bytes": 900 << 20, "predicted_peak_bytes": 850 << 20, "swaps": 400}}
    report = {"args": {"depth_batch": 8, "depth_image_size": 32, "depth_budget_mb": 1536},
              "table_a": {}, "at_base": {}, "at_opt": {}, "table_b": [row]}
    printed = benchmark.format_report(report)
    assert printed.startswith("Table 1(b)") and "Table 1(a)" not in printed
    assert "| ResNet-1001 | OOM | 1400 (1200) | 157 | 900 (850) | 400 |" in printed


@pytest.mark.slow
@pytest.mark.device
def test_lowest_plan_m_opt_measures_below_the_unoptimized_step():
    # the paper's M_opt at the smallest size that shows it: ResNet-20 at batch 32, each in a fresh process
    from seqmem.runtime.device import run_with_budget

    args = (20, 32, 32, 10)
    baseline = run_with_budget(benchmark.measure, "baseline", *args, 512, budget_mb=512)
    smallest = run_with_budget(benchmark.measure_smallest, *args, budget_mb=512)
    assert baseline.ok and smallest.ok, (baseline.message, smallest.message)
    lowest, unoptimized = smallest.value, baseline.value
    assert lowest["swaps"] > 0 and lowest["predicted_peak_bytes"] <= lowest["target_bytes"]
    assert lowest["predicted_peak_bytes"] < unoptimized["predicted_peak_bytes"]
    assert lowest["peak_bytes"] < unoptimized["peak_bytes"]


def test_lowest_plan_of_an_unknown_variant_is_refused_before_building_anything():
    with pytest.raises(ValueError, match="variant must be one of .*'seqmem-lossless'.*got 'baseline'"):
        benchmark.measure_smallest(20, 32, 32, 10, variant="baseline")
