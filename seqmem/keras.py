"""Keras integration: `model.fit` with a budget-optimized step.

    model.compile(optimizer, loss)
    seqmem.keras.fit_within_budget(model, memory_budget_mb=200)
    model.fit(dataset, epochs=2)

The public face of `seqmem.runtime.keras`, where the contract is stated.
"""

from seqmem.runtime.keras import fit_within_budget, saved_model_step

__all__ = ["fit_within_budget", "saved_model_step"]
