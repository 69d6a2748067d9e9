"""Jobs run in fresh emulated-device processes by test_optimize (module-level, so they pickle)."""

import numpy as np
import pytest


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


def fitting_step(name, batch, steps=2):
    """An example's step optimized for a budget it fits as it is vs the original, same initial weights: (the
    plan's pinned order, losses equal, variables equal, the optimized step's measured peaks, its predicted
    peak). The optimized step runs first, in a fresh arena as predicted."""
    import tensorflow as tf

    from seqmem.examples.steps import build_example
    from seqmem.runtime.measure import step_peaks
    from seqmem.runtime.optimize import optimize

    tf.config.experimental.enable_op_determinism()
    copy = build_example(name, batch)
    args = copy.make_inputs(0)
    step = optimize(copy.step, 1e5, input_signature=copy.input_specs, calibrate=False)
    optimized_losses = [float(step(*args)) for _ in range(steps)]
    peaks = step_peaks(step, args, copy.model.variables, 2)
    original = build_example(name, batch)
    losses = [float(original.step(*args)) for _ in range(steps)]
    same_variables = all(
        np.array_equal(a.numpy(), b.numpy()) for a, b in zip(original.model.variables, copy.model.variables)
    )
    return (step.plan.pinned_order, losses == optimized_losses, same_variables, peaks,
            step.plan.predicted_peak_after_bytes)


def held_memory(name, batch, held_mb, steps=3):
    """An example's step optimized for a budget it fits, alone on the device and again while the process holds
    `held_mb` MiB more there: (the two predicted peaks, the bytes held, the measured peaks of the second,
    pinned as planned, beside them)."""
    import tensorflow as tf

    from seqmem.examples.steps import build_example
    from seqmem.runtime.measure import step_peaks
    from seqmem.runtime.optimize import optimize

    example = build_example(name, batch)
    args = example.make_inputs(0)
    alone = optimize(example.step, 1e5, input_signature=example.input_specs, calibrate=False)
    held = tf.fill([held_mb << 18], 1.0)  # float32: held_mb MiB in the arena
    beside = optimize(example.step, 1e5, input_signature=example.input_specs, calibrate=False)
    peaks = step_peaks(beside, args, example.model.variables, steps, warm_up=True)
    return (alone.plan.predicted_peak_after_bytes, beside.plan.predicted_peak_after_bytes, held.shape[0] * 4,
            peaks)


FRACTIONS = (0.8, 0.85, 0.9, 0.95, 0.98)


def _optimized_below_its_peak(example, fractions=FRACTIONS, **options):
    """`optimize` of an example's step for the smallest budget, of `fractions` of its predicted peak tried
    from the lowest, that has a plan (each infeasible try costs a full planning: 10-14 s for the resnet)."""
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime.optimize import optimize

    before = optimize(example.step, 1e6, input_signature=example.input_specs).plan.predicted_peak_before_bytes
    for fraction in fractions:
        try:
            return optimize(example.step, fraction * before / (1 << 20), input_signature=example.input_specs,
                            safety_margin=0.0, calibrate=False, **options)
        except InfeasibleBudgetError:
            continue
    raise AssertionError(f"no budget below {before} bytes was feasible")


def conservation_kinds(name, batch, options, fractions=FRACTIONS, steps=2):
    """An example's step optimized with `options` (of `optimize`) vs the original, same initial weights: (kinds
    used, losses, original losses, variables equal, measured peaks, predicted peak, the original's measured
    peaks, the gradient barriers the plan split); the plan is made below the step's predicted peak. The optimized step is measured first, in a fresh
    arena as predicted (measured after the original, its peak rose by 12 MB in about one process in five:
    the arena's history decides which chunks are free); the original's peaks leave out what the optimized
    step left in the arena (its weights and slots)."""
    import tensorflow as tf

    from seqmem.examples.steps import build_example
    from seqmem.runtime import device
    from seqmem.runtime.measure import step_peaks

    tf.config.experimental.enable_op_determinism()
    copy = build_example(name, batch)
    args = copy.make_inputs(0)
    step = _optimized_below_its_peak(copy, fractions, **options)
    optimized_losses = [float(step(*args)) for _ in range(steps)]
    peaks = step_peaks(step, args, copy.model.variables, 2)  # after the losses: it leaves the optimizer's slots changed
    left_by_optimized = device.memory_stats().current_bytes
    original = build_example(name, batch)
    losses = [float(original.step(*args)) for _ in range(steps)]
    original_peaks = [peak - left_by_optimized
                      for peak in step_peaks(original.step, args, original.model.variables, 2)]
    same_variables = all(
        np.array_equal(a.numpy(), b.numpy()) for a, b in zip(original.model.variables, copy.model.variables)
    )
    return (sorted({d.kind.name for d in step.plan.decisions}), optimized_losses, losses, same_variables, peaks,
            step.plan.predicted_peak_after_bytes, original_peaks, step.plan.split_barriers)


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
    host_nodes = [n.device for n in step.graph_def.node if "seqmem_swap" in n.name and n.name.endswith("/out")]
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


def later_oom(name, batch, budget_mb, arena_mb, steps=2):
    """An example's step optimized for `budget_mb`, then called `steps` times while the arena (of `arena_mb`)
    holds tensors that leave the step less room than calibration measured it using: (log lines, losses,
    variables, targets of the plan before and after, measured peak), or (None, log lines, the error's last line)
    when a call ran out of memory for good. Without `budget_mb`: the original step's (losses, variables) on the
    same inputs."""
    import logging

    import tensorflow as tf

    from seqmem.examples.steps import build_example
    from seqmem.runtime.optimize import optimize

    tf.config.experimental.enable_op_determinism()
    example = build_example(name, batch)
    args = example.make_inputs(0)
    if budget_mb is None:
        losses = [float(example.step(*args)) for _ in range(steps)]
        return losses, [v.numpy() for v in example.model.variables]
    step = optimize(example.step, budget_mb, input_signature=example.input_specs, sample_inputs=args,
                    safety_margin=0.0)
    planned, measured = step.plan.target_bytes, step.plan.measured_peak_bytes
    # in the arena now: the weights and slots; a step needs (measured - in use) more. Leave it 10% of the
    # arena less than that, in 1 MiB pieces (one piece that large may find no free chunk): the call runs out
    # of memory. The pieces go before the re-planned step runs: in an arena they fragment, whether it finds
    # a free chunk for each request is luck (1 re-run in 4 did not), and the test is about the re-run.
    blocker_bytes = (arena_mb << 20) - measured + (arena_mb << 20) // 10
    blocker = [tf.ones([1 << 20], tf.uint8) for _ in range(blocker_bytes >> 20)]
    replan = step.replan

    def replan_after_freeing(plan):
        blocker.clear()
        return replan(plan)

    step.replan = replan_after_freeing
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("seqmem").addHandler(handler)
    try:
        losses = [float(step(*args)) for _ in range(steps)]
    except tf.errors.ResourceExhaustedError as error:  # the error's last line is seqmem's note
        return None, lines, error.message.splitlines()[-1]
    return lines, losses, [v.numpy() for v in example.model.variables], planned, step.plan.target_bytes, measured


def dropout_equivalence(batch, budget_mb, steps=3):
    """A Keras model with `Dropout`, `MultiHeadAttention(dropout=...)` and noise from a `tf.random.Generator`,
    optimized with calibration for `budget_mb` vs the original, same initial weights, each step's first call
    from a fresh function: (the plan measured a peak, losses equal, variables and generator states equal)."""
    import tensorflow as tf

    from seqmem.runtime.optimize import optimize

    tf.config.experimental.enable_op_determinism()

    def build():
        tf.keras.utils.set_random_seed(0)
        tokens = tf.keras.Input([16, 32])
        attended = tf.keras.layers.MultiHeadAttention(2, 16, dropout=0.2)(tokens, tokens)
        hidden = tf.keras.layers.Dropout(0.3)(tf.keras.layers.Dense(64, activation="relu")(tokens + attended))
        model = tf.keras.Model(tokens, tf.keras.layers.Dense(4)(tf.keras.layers.GlobalAveragePooling1D()(hidden)))
        optimizer = tf.keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        noise = tf.random.Generator.from_seed(1)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                noisy = x + 0.1 * noise.normal(tf.shape(x))
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, model(noisy, training=True), from_logits=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return model, noise, step

    rng = np.random.default_rng(0)
    args = (tf.constant(rng.standard_normal([batch, 16, 32]).astype(np.float32)),
            tf.constant(rng.integers(0, 4, [batch]).astype(np.int32)))
    model, noise, original = build()
    losses = [float(original(*args)) for _ in range(steps)]
    copy, copy_noise, step = build()
    optimized = optimize(step, budget_mb, sample_inputs=args)
    optimized_losses = [float(optimized(*args)) for _ in range(steps)]
    same_variables = all(np.array_equal(a.numpy(), b.numpy()) for a, b in
                         zip(model.variables + [noise.state], copy.variables + [copy_noise.state]))
    return optimized.plan.measured_peak_bytes is not None, losses == optimized_losses, same_variables


def loss_scaled_equivalence(batch, steps=3):
    """A mixed-precision MLP whose `LossScaleOptimizer` applies the gradients in a `tf.cond` over their finite
    check (its weights' gradients are much of its peak), optimized without calibration for halfway between
    its smallest achievable peak (the update branch's working set) and its predicted peak, vs the original,
    same initial weights: (the decisions restored in the conditional's
    branches, the optimized step's measured peaks, the original's, losses equal, weights equal, the
    original's losses changed from call to call: its updates applied, not skipped by the loss scale). The
    optimized step is measured first, in a fresh arena; the original's peaks leave out what it left there."""
    import tensorflow as tf

    from models.zoo.steps import loss_scaled_training
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime import device
    from seqmem.runtime.measure import step_peaks
    from seqmem.runtime.optimize import optimize

    tf.config.experimental.enable_op_determinism()

    def build():
        tf.keras.utils.set_random_seed(0)
        model, _, step = loss_scaled_training(lambda: tf.keras.Sequential(
            [tf.keras.Input([512])] + [tf.keras.layers.Dense(512, activation="relu") for _ in range(8)]
            + [tf.keras.layers.Dense(10)]))
        return model, step

    rng = np.random.default_rng(0)
    args = (tf.constant(rng.standard_normal([batch, 512]).astype(np.float32)),
            tf.constant(rng.integers(0, 10, [batch]).astype(np.int32)))
    copy, step = build()
    before = optimize(step, 1e6, sample_inputs=args, calibrate=False).plan.predicted_peak_before_bytes
    with pytest.raises(InfeasibleBudgetError) as infeasible:
        optimize(step, 1, sample_inputs=args, calibrate=False)
    budget_mb = (infeasible.value.smallest_peak_bytes + before) / 2 / (1 << 20)
    optimized = optimize(step, budget_mb, sample_inputs=args, calibrate=False)
    optimized_losses = [float(optimized(*args)) for _ in range(steps)]
    peaks = step_peaks(optimized, args, copy.variables, 2)
    left_by_optimized = device.memory_stats().current_bytes
    model, original = build()
    losses = [float(original(*args)) for _ in range(steps)]
    same_weights = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.variables, copy.variables))
    original_peaks = [peak - left_by_optimized for peak in step_peaks(original, args, model.variables, 2)]
    return (sum(d.in_branch for d in optimized.plan.decisions), peaks, original_peaks, losses == optimized_losses,
            same_weights, len(set(losses)) == steps)


def hard_swish_equivalence(batch, fraction, steps=3):
    """A CNN whose activation is hard swish as Keras MobileNetV3 writes it, x * (relu6(x + 3) * (1 / 6)), whose
    gradient's products Grappler regroups, optimized without calibration for `fraction` of its predicted peak vs
    the original, same initial weights: (decisions, the plan pinned an order, losses equal, variables equal)."""
    import tensorflow as tf

    from seqmem.runtime.optimize import optimize
    from tests.keras_steps import classifier_step

    tf.config.experimental.enable_op_determinism()

    def build():
        tf.keras.utils.set_random_seed(0)
        images = tf.keras.Input([32, 32, 3])
        x = images
        for filters in (16, 16, 32, 32):
            x = tf.keras.layers.Conv2D(filters, 3, padding="same")(x)
            x = tf.keras.layers.Multiply()([x, tf.nn.relu6(x + 3.0) * (1.0 / 6.0)])
        model = tf.keras.Model(images, tf.keras.layers.Dense(10)(tf.keras.layers.GlobalAveragePooling2D()(x)))
        optimizer = tf.keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
        return model.variables + optimizer.variables, classifier_step(model, optimizer)

    rng = np.random.default_rng(0)
    args = (tf.constant(rng.standard_normal([batch, 32, 32, 3]).astype(np.float32)),
            tf.constant(rng.integers(0, 10, [batch]).astype(np.int32)))
    variables, original = build()
    losses = [float(original(*args)) for _ in range(steps)]
    copy, step = build()
    before = optimize(step, 1e6, sample_inputs=args, calibrate=False).plan.predicted_peak_before_bytes
    optimized = optimize(step, fraction * before / (1 << 20), sample_inputs=args, safety_margin=0.0,
                         calibrate=False)
    optimized_losses = [float(optimized(*args)) for _ in range(steps)]
    same_variables = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(variables, copy))
    return len(optimized.plan.decisions), bool(optimized.plan.pinned_order), losses == optimized_losses, same_variables


def gan_equivalence(batch, steps=3):
    """A small GAN step as TensorFlow's DCGAN tutorial writes it (noise drawn in the step, dropout in the
    discriminator, a tape per loss, an Adam per network, the losses returned summed), optimized for a budget
    it fits once pinned, without calibration, vs the original, same initial weights: (the plan pinned an
    order, losses equal, variables equal). Its two cross-entropies of the fake logits compute one product
    in their gradients, which Grappler merges in the original and a sum of four reads."""
    import tensorflow as tf

    from seqmem.runtime.optimize import optimize

    tf.config.experimental.enable_op_determinism()
    layers = tf.keras.layers
    cross_entropy = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    def build():
        tf.keras.utils.set_random_seed(0)
        networks = (tf.keras.Sequential([tf.keras.Input([16]), layers.Dense(256), layers.LeakyReLU(),
                                         layers.Dense(64, activation="tanh")]),
                    tf.keras.Sequential([tf.keras.Input([64]), layers.Dense(256), layers.LeakyReLU(),
                                         layers.Dropout(0.3), layers.Dense(1)]))
        optimizers = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.Adam(1e-3)
        for optimizer, network in zip(optimizers, networks):
            optimizer.build(network.trainable_variables)
        generator, discriminator = networks

        @tf.function
        def step(real_samples):
            noise = tf.random.normal([batch, 16])
            with tf.GradientTape() as generator_tape, tf.GradientTape() as discriminator_tape:
                real = discriminator(real_samples, training=True)
                fake = discriminator(generator(noise, training=True), training=True)
                losses = (cross_entropy(tf.ones_like(fake), fake),
                          cross_entropy(tf.ones_like(real), real) + cross_entropy(tf.zeros_like(fake), fake))
            for tape, loss, optimizer, network in zip((generator_tape, discriminator_tape), losses, optimizers,
                                                      networks):
                optimizer.apply_gradients(zip(tape.gradient(loss, network.trainable_variables),
                                              network.trainable_variables))
            return losses[0] + losses[1]

        variables = [v for network in networks for v in network.variables]
        return variables + [v for optimizer in optimizers for v in optimizer.variables], step

    samples = tf.constant(np.random.default_rng(0).standard_normal([batch, 64]).astype(np.float32))
    variables, original = build()
    losses = [float(original(samples)) for _ in range(steps)]
    copy, step = build()
    optimized = optimize(step, 1024, sample_inputs=(samples,), calibrate=False)
    optimized_losses = [float(optimized(samples)) for _ in range(steps)]
    same_variables = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(variables, copy))
    return bool(optimized.plan.pinned_order), losses == optimized_losses, same_variables


def inputs_counted(rows=2048, features=1024):
    """A dense step optimized with NumPy sample inputs, and with an input signature alone: (the inputs'
    bytes, then for each the bytes the analysis found in use before the step beyond what the process held
    before `optimize`)."""
    import tensorflow as tf

    from seqmem.runtime import device
    from seqmem.runtime.optimize import optimize

    step, signature = _dense_step(rows, features)
    features_array = np.random.default_rng(0).random([rows, features], np.float32)
    labels = np.random.default_rng(1).integers(0, 10, [rows]).astype(np.int32)
    counted = []
    for options in (dict(sample_inputs=(features_array, labels)), dict(input_signature=signature)):
        before = device.memory_stats().current_bytes
        optimized = optimize(step, 1e5, calibrate=False, **options)
        counted.append(optimized.analysis.in_use_before_bytes[""] - before)
    return features_array.nbytes + labels.nbytes, counted


def held_by_an_infeasible_budget_error(rows=2048, features=1024):
    """Bytes in use on the device before `optimize` of a dense step for a budget no plan fits (1 MiB: none is
    built or measured), and while its InfeasibleBudgetError is held, with calibration on and off."""
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime import device
    from seqmem.runtime.optimize import optimize

    step, signature = _dense_step(rows, features)
    in_use = []
    for calibrate in (False, True):
        before = device.memory_stats().current_bytes
        try:
            optimize(step, 1, input_signature=signature, calibrate=calibrate)
        except InfeasibleBudgetError as error:
            kept = error  # noqa: F841 - held, as a caller retrying for its smallest peak holds it
            in_use.append((before, device.memory_stats().current_bytes))
    return in_use


def _dense_step(rows, features):
    """A Keras dense classifier's training step on [rows, features] float32 features and int32 labels, traced,
    and its input signature."""
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input([features]), tf.keras.layers.Dense(10)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    signature = (tf.TensorSpec([rows, features]), tf.TensorSpec([rows], tf.int32))
    step.get_concrete_function(*signature)
    return step, signature
