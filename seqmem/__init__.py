"""seqmem: fit a TensorFlow training step into a fixed device-memory budget.

Importing seqmem does not import TensorFlow, so `seqmem.device` can configure
the emulated device first; the names below load their modules on first use.

The pipeline, one package a stage:
capture (`seqmem.edge`) -> IR (`seqmem.ir`) -> analyze (`seqmem.analyze`, `seqmem.sim`) -> plan
(`seqmem.plan`, deciding `seqmem.decisions`) -> rewrite (`seqmem.rewrite`) -> run (`seqmem.runtime`).
"""

import importlib

__all__ = [
    "Graph",
    "InfeasibleBudgetError",
    "MachineModel",
    "MemoryEfficientBahdanauAttention",
    "MemoryEfficientGRU",
    "MemoryEfficientLSTM",
    "MemoryEfficientMultiHeadAttention",
    "OptimizedStep",
    "Plan",
    "Profile",
    "StepAnatomy",
    "TensorRef",
    "analyze_step",
    "analyze_timing",
    "device",
    "keras",
    "optimize",
    "profile",
    "projected_mean_cross_entropy",
    "projected_sparse_cross_entropy",
    "simulate",
]

_HOME = {
    "Graph": "seqmem.ir.graph",
    "TensorRef": "seqmem.ir.graph",
    "StepAnatomy": "seqmem.analyze.anatomy",
    "analyze_step": "seqmem.analyze.anatomy",
    "MachineModel": "seqmem.analyze.critical_path",
    "analyze_timing": "seqmem.analyze.critical_path",
    "simulate": "seqmem.sim.simulator",
    "Profile": "seqmem.runtime.profile",
    "profile": "seqmem.runtime.profile",
    "InfeasibleBudgetError": "seqmem.errors",
    "Plan": "seqmem.decisions.plan",
    "OptimizedStep": "seqmem.runtime.optimized_step",
    "optimize": "seqmem.runtime.optimize",
    "MemoryEfficientBahdanauAttention": "seqmem.layers.attention",
    "MemoryEfficientLSTM": "seqmem.layers.recurrent",
    "MemoryEfficientGRU": "seqmem.layers.recurrent",
    "MemoryEfficientMultiHeadAttention": "seqmem.layers.multi_head_attention",
    "projected_mean_cross_entropy": "seqmem.layers.softmax_loss",
    "projected_sparse_cross_entropy": "seqmem.layers.softmax_loss",
}
_MODULES = {"device": "seqmem.device", "keras": "seqmem.keras"}


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'seqmem' has no attribute {name!r}")
