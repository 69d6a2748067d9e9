"""Keras integration: one call makes `model.fit` train with a budget-optimized step.

    model.compile(optimizer, loss, metrics)
    seqmem.keras.fit_within_budget(model, memory_budget_mb=170)
    model.fit(dataset, epochs=...)

The model's `train_step` is wrapped in a tf.function, optimized with
`seqmem.optimize` for the first batch's shapes, and run by `fit` in place of
Keras's own train function. A batch of other shapes (e.g. the last, smaller
one) gets its own optimized step. One step per call (steps_per_execution 1).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from seqmem.optimizer import OptimizedStep, optimize

__all__ = ["fit_within_budget"]


def fit_within_budget(model: tf.keras.Model, memory_budget_mb: float, **optimize_options: Any) -> tf.keras.Model:
    """Install a budget-optimized train function on a compiled `model`; returns `model`.

    optimize_options: passed on to `seqmem.optimize` (e.g. safety_margin).
    Call it after `compile` (which resets the train function). Raises ValueError
    for an uncompiled model or a bad budget (checked when the first batch arrives).
    """
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled_loss", None):
        raise ValueError("compile the model (model.compile(optimizer, loss)) before fit_within_budget")
    if getattr(model, "_steps_per_execution", None) is not None and int(model._steps_per_execution) != 1:
        raise ValueError("fit_within_budget runs one step per call: compile with steps_per_execution=1")
    steps: dict[tuple, OptimizedStep] = {}

    @tf.function
    def train_step(data):
        logs = model.train_step(data)
        model._train_counter.assign_add(1)
        return logs

    def train_function(iterator):
        data = next(iterator)
        specs = tf.nest.map_structure(tf.TensorSpec.from_tensor, data)
        key = tuple((tuple(spec.shape), spec.dtype.name) for spec in tf.nest.flatten(specs))
        if key not in steps:
            steps[key] = optimize(train_step, memory_budget_mb, input_signature=[specs], **optimize_options)
        return steps[key](data)

    train_function.optimized_steps = steps  # by batch shapes, for inspection (e.g. .plan)
    model.train_function = train_function
    return model
