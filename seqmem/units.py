"""Units: seqmem counts memory in bytes and time in seconds; MiB only at the edges (budgets, reports)."""

__all__ = ["MIB", "mib"]

MIB = 1 << 20  # bytes in a MiB; budgets (`memory_budget_mb`) and reports are in MiB


def mib(size_bytes: float) -> float:
    """`size_bytes` in MiB."""
    return size_bytes / MIB
