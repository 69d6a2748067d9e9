"""Keras integration: `model.fit` with a budget-optimized step, and the training step of a saved model.

    model.compile(optimizer, loss, metrics)
    seqmem.keras.fit_within_budget(model, memory_budget_mb=170)
    model.fit(dataset, epochs=...)

`fit_within_budget` wraps the model's `train_step` in a tf.function, optimizes
it with `seqmem.optimize` for the first batch's shapes, and has `fit` run it in
place of Keras's own train function. A batch of other shapes (e.g. the last,
smaller one) gets its own optimized step. One step per call (steps_per_execution 1).

`saved_model_step` loads a saved, compiled `.keras` model and returns its
training step at a batch size, for `seqmem profile` and `seqmem plan`.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf
from keras.src.engine.training import reduce_per_replica  # what Keras' own train function reduces logs with

from seqmem.errors import UnknownShapeError
from seqmem.runtime.measure import inputs_like
from seqmem.runtime.optimize import OptimizedStep, optimize

__all__ = ["fit_within_budget", "saved_model_step"]


def fit_within_budget(model: tf.keras.Model, memory_budget_mb: float, **optimize_options: Any) -> tf.keras.Model:
    """Install a budget-optimized train function on a compiled `model`; returns `model`.

    optimize_options: passed on to `seqmem.optimize` (e.g. safety_margin); each batch shape's step is
    optimized, and calibrated, on the first batch of that shape (`sample_inputs`).
    Under a `tf.distribute` strategy (the model built in its scope) each
    replica runs the step, as Keras' own `fit` does, and every worker makes the
    same plan. Call it after `compile` (which resets the train function). Raises ValueError
    for an uncompiled model or a bad budget (checked when the first batch arrives).
    """
    _check_compiled(model, "compile the model (model.compile(optimizer, loss)) before fit_within_budget")
    if getattr(model, "_steps_per_execution", None) is not None and int(model._steps_per_execution.numpy()) != 1:
        raise ValueError("fit_within_budget runs one step per call: compile with steps_per_execution=1")
    strategy = model.distribute_strategy
    local_replicas = _local_replicas(strategy)
    if local_replicas != 1:
        raise ValueError(f"fit_within_budget runs one replica per worker, on one device; this strategy has "
                         f"{local_replicas} here: give each worker one device")
    steps: dict[tuple, OptimizedStep] = {}

    def run_step(data):
        logs = model.train_step(data)
        model._train_counter.assign_add(1)
        return logs

    @tf.function
    def train_step(data):  # as Keras' own train function: each replica's step, the logs reduced as Keras does
        return reduce_per_replica(strategy.run(run_step, args=(data,)), strategy,
                                  reduction=model.distribute_reduction_method)

    def train_function(iterator):
        # a distributed iterator gives this worker's replica's batch wrapped as a PerReplica value
        data = tf.nest.map_structure(lambda value: strategy.experimental_local_results(value)[0], next(iterator))
        specs = tf.nest.map_structure(tf.TensorSpec.from_tensor, data)
        key = tuple((tuple(spec.shape), spec.dtype.name) for spec in tf.nest.flatten(specs))
        if key not in steps:
            with strategy.scope():  # several workers agree on one plan (`seqmem.runtime.workers`)
                options = {"input_signature": [specs], "sample_inputs": (data,), **optimize_options}  # this batch
                steps[key] = optimize(train_step, memory_budget_mb, **options)
        return steps[key](data)

    train_function.optimized_steps = steps  # by batch shapes, for inspection (e.g. .plan)
    model.train_function = train_function
    return model


def saved_model_step(batch: int, path: str) -> tuple[Any, Any, list]:
    """(step, inputs, input specs) of the compiled Keras model saved at `path`, at batch size `batch`.

    step(features, labels) runs the model's `train_step` (its loss and optimizer)
    and returns the loss. Features follow the model's inputs; labels its
    outputs: integer class ids of the output's shape without its last axis for a
    sparse categorical loss, floats of the output's shape otherwise. Inputs are
    synthetic (`measure.inputs_like`). Raises FileNotFoundError, ValueError for a
    model saved without `compile`, UnknownShapeError for inputs of unknown shape.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no saved model at {path!r}: give the path of a .keras file (model.save('m.keras'))")
    model = tf.keras.models.load_model(path)
    _check_compiled(model, f"{path} holds no optimizer and loss: save the model after model.compile(...)")
    feature_specs = [_batched_spec(t, batch, f"input {t.name!r}") for t in model.inputs]
    sparse = "sparse" in _loss_name(model.loss)
    label_specs = []
    for output in model.outputs:
        spec = _batched_spec(output, batch, f"output {output.name!r}")
        label_specs.append(tf.TensorSpec(spec.shape[:-1], tf.int32) if sparse else spec)
    features = feature_specs[0] if len(feature_specs) == 1 else tuple(feature_specs)
    labels = label_specs[0] if len(label_specs) == 1 else tuple(label_specs)

    @tf.function
    def step(x, y):
        return model.train_step((x, y))["loss"]

    specs = [features, labels]
    return step, tuple(inputs_like(specs)), specs


def _local_replicas(strategy: tf.distribute.Strategy) -> int:
    """How many replicas of `strategy` run in this process."""
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy, which has no device list: one replica
        return 1


def _check_compiled(model: tf.keras.Model, message: str) -> None:
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled_loss", None):
        raise ValueError(message)


def _batched_spec(tensor: Any, batch: int, role: str) -> tf.TensorSpec:
    shape = tensor.shape.as_list()
    if not shape or any(d is None for d in shape[1:]):
        raise UnknownShapeError(f"the model's {role} has shape {shape}: seqmem needs every dimension but the batch")
    return tf.TensorSpec([batch] + shape[1:], tensor.dtype)


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return loss
    return str(getattr(loss, "name", None) or getattr(loss, "__name__", "") or type(loss).__name__).lower()
