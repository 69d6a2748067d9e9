"""Jobs run in fresh emulated-device processes by test_optimize (module-level, so they pickle)."""

import numpy as np


def equivalence(name, batch, steps=3):
    """Optimized vs original step, same initial weights: (#tensors conserved, #loop accumulators swapped, losses
    equal, variables equal, loop bound)."""
    import tensorflow as tf

    from seqmem.examples.steps import build_example

    tf.config.experimental.enable_op_determinism()
    original, copy = build_example(name, batch), build_example(name, batch)
    step = _optimized_below_its_peak(copy)
    args = original.make_inputs(0)
    losses = [float(original.step(*args)) for _ in range(steps)]
    optimized_losses = [float(step(*args)) for _ in range(steps)]
    same_variables = all(
        np.array_equal(a.numpy(), b.numpy()) for a, b in zip(original.model.variables, copy.model.variables)
    )
    plan = step.plan
    return (len(plan.decisions), len(plan.loop_swaps), losses == optimized_losses, same_variables,
            plan.loop_parallel_iterations)


def _optimized_below_its_peak(example, **options):
    """`optimize` of an example's step for the largest budget in 80-98% of its predicted peak that has a plan."""
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime.optimize import optimize

    before = optimize(example.step, 1e6, input_signature=example.input_specs).plan.predicted_peak_before_bytes
    for fraction in (0.8, 0.85, 0.9, 0.95, 0.98):
        try:
            return optimize(example.step, fraction * before / (1 << 20), input_signature=example.input_specs,
                            safety_margin=0.0, calibrate=False, **options)
        except InfeasibleBudgetError:
            continue
    raise AssertionError(f"no budget below {before} bytes was feasible")


def conservation_kinds(name, batch, options, steps=2):
    """An example's step optimized with `options` (of `optimize`) vs the original, same initial weights: (kinds
    used, losses, original losses, variables equal, measured peaks, predicted peak, the original's measured
    peaks); the plan is made below the step's predicted peak. The optimized step's peaks leave out what the
    original left in the arena (its weights and slots): they are the step's own, as predicted."""
    import tensorflow as tf

    from seqmem.examples.steps import build_example
    from seqmem.runtime import device
    from seqmem.runtime.measure import step_peaks

    tf.config.experimental.enable_op_determinism()
    original = build_example(name, batch)
    args = original.make_inputs(0)
    losses = [float(original.step(*args)) for _ in range(steps)]
    original_peaks = step_peaks(original.step, args, original.model.variables, 2)
    left_by_original = device.memory_stats().current_bytes
    copy = build_example(name, batch)
    step = _optimized_below_its_peak(copy, **options)
    optimized_losses = [float(step(*args)) for _ in range(steps)]
    same_variables = all(
        np.array_equal(a.numpy(), b.numpy()) for a, b in zip(original.model.variables, copy.model.variables)
    )
    peaks = [peak - left_by_original for peak in step_peaks(step, args, copy.model.variables, 2)]
    return (sorted({d.kind for d in step.plan.decisions}), optimized_losses, losses, same_variables, peaks,
            step.plan.predicted_peak_after_bytes, original_peaks)


def host_device_backend_equivalence():
    """The GPU backend with two logical CPUs: compute on CPU:1, host copies on CPU:0."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()
    from seqmem.edge.swap_nodes import HostDeviceBackend
    from seqmem.examples.steps import build_example

    with tf.device("/device:CPU:1"):
        original, copy = build_example("cnn", 64), build_example("cnn", 64)
        args = original.make_inputs(0)
        step = _optimized_below_its_peak(copy, backend=HostDeviceBackend("/device:CPU:0", "/device:CPU:1"))
        losses = [float(original.step(*args)) for _ in range(2)]
        optimized = [float(step(*args)) for _ in range(2)]
    host_nodes = [n.device for n in step.graph_def.node if n.name.startswith("seqmem_swap") and n.name.endswith("/out")]
    return len(step.plan.decisions), losses == optimized, sorted(set(host_nodes))


def keras_fit(batch, seqmem_budget_mb=None, epochs=2, example="cnn"):
    """model.fit of a built-in example on synthetic data, optionally under seqmem; (loss history, swaps made)."""
    import tensorflow as tf

    from seqmem.examples.steps import build_example
    from seqmem.runtime.keras import fit_within_budget

    tf.config.experimental.enable_op_determinism()
    built = build_example(example, batch)
    images, labels = built.make_inputs(0)
    model = built.model
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fitted = {}
    if seqmem_budget_mb is not None:
        fit_within_budget(model, seqmem_budget_mb, safety_margin=0.3)
        fitted = model.train_function.optimized_steps
    dataset = tf.data.Dataset.from_tensor_slices((tf.concat([images, images], 0), tf.concat([labels, labels], 0)))
    history = model.fit(dataset.batch(batch), epochs=epochs, verbose=0, shuffle=False)
    swaps = len(next(iter(fitted.values())).plan.decisions) if seqmem_budget_mb is not None else 0
    return history.history["loss"], swaps
