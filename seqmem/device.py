"""The device seqmem measures on: the emulated device on CPU (a bounded memory arena), or a GPU.

    from seqmem import device
    device.configure_emulated_device(200)   # before TensorFlow starts: a 200 MiB device
    run = device.run_with_budget(job, budget_mb=200)   # or: a job in a fresh process with its own budget

The public face of `seqmem.runtime.device`, whose docstring says what the emulation models of a GPU and
what it does not. Importing this module does not import TensorFlow.
"""

from seqmem.runtime.device import (
    BudgetRun,
    MemoryStats,
    configure_emulated_device,
    emulated_budget_mb,
    measuring_device_present,
    memory_device,
    memory_stats,
    on_device,
    reset_peak,
    run_with_budget,
)

__all__ = [
    "BudgetRun",
    "MemoryStats",
    "configure_emulated_device",
    "emulated_budget_mb",
    "measuring_device_present",
    "memory_device",
    "memory_stats",
    "on_device",
    "reset_peak",
    "run_with_budget",
]
