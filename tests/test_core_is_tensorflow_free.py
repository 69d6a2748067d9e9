"""The planner core (IR, analysis, simulator, selector, rewrite) runs without TensorFlow."""

import subprocess
import sys

CORE = ["seqmem", "seqmem.ir", "seqmem.ir.graph", "seqmem.ir.op_tables", "seqmem.anatomy", "seqmem.critical_path",
        "seqmem.analysis", "seqmem.sim.simulator", "seqmem.sim.allocator", "seqmem.sim.scratch", "seqmem.sim.schedule",
        "seqmem.plan", "seqmem.layers", "seqmem.swap.plan", "seqmem.swap.kinds", "seqmem.swap.triggers",
        "seqmem.swap.rewrite", "seqmem.swap.vocabulary_head", "seqmem.swap.backward_views", "seqmem.errors", "seqmem.units", "seqmem.cli"]


def test_importing_the_core_does_not_import_tensorflow():
    code = f"import importlib, sys\nfor m in {CORE!r}:\n    importlib.import_module(m)\nprint('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
