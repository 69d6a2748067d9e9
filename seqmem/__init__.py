"""seqmem: fit a TensorFlow training step into a fixed device-memory budget.

Importing seqmem does not import TensorFlow, so `seqmem.device` can configure
the emulated device first; the names below load their modules on first use.
"""

import importlib

__all__ = [
    "Graph",
    "InfeasibleBudgetError",
    "MachineModel",
    "MemoryEfficientBahdanauAttention",
    "OptimizedStep",
    "Profile",
    "StepAnatomy",
    "SwapPlan",
    "TensorRef",
    "analyze_step",
    "analyze_timing",
    "optimize",
    "profile",
    "simulate",
]

_HOME = {
    "Graph": "seqmem.graph",
    "TensorRef": "seqmem.graph",
    "StepAnatomy": "seqmem.anatomy",
    "analyze_step": "seqmem.anatomy",
    "MachineModel": "seqmem.critical_path",
    "analyze_timing": "seqmem.critical_path",
    "simulate": "seqmem.memory",
    "Profile": "seqmem.profiling",
    "profile": "seqmem.profiling",
    "InfeasibleBudgetError": "seqmem.budget",
    "SwapPlan": "seqmem.swap.plan",
    "OptimizedStep": "seqmem.optimizer",
    "optimize": "seqmem.optimizer",
    "MemoryEfficientBahdanauAttention": "seqmem.attention",
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'seqmem' has no attribute {name!r}")
